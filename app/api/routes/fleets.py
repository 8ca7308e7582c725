"""``/v1/fleets``: one model and dataset across many simulated phones, one job per phone."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import Response
from sqlmodel import Session, select

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.api.routes.adapters import AdapterFormat, FormatQuery, adapter_download
from app.fleet_schemas import DataSplit, FleetCreate, FleetPublic, FleetsPublic
from app.fleet_summary import fleet_public
from app.planning import device_or_422, plan_job
from app.schemas import JobCreate
from app.submit import (
    check_references,
    insert_job,
    lock_queue,
    require_queue,
    require_queue_room,
)
from mebp_core.config import MAX_STEPS
from mebp_core.federated.rounds import reference_steps
from mebp_core.federated.split import SplitError, SplitSpec, read_rows, split_rows
from mebp_core.store.resolve import source_config
from service.crud import TERMINAL, request_cancel
from service.federation import queue_references, start_round
from service.models import Dataset, Fleet, FleetRound, Job
from service.registry import model_source
from service.settings import Settings
from service.storage import dataset_path, new_id, round_adapter_dir, write_shards

router = APIRouter(prefix="/fleets", tags=["fleets"])
JOB_FIELDS = ("model", "validation_file", "memory_budget_mb", "method", "hyperparameters",
              "config", "seed", "metadata", "allow_infeasible")


@router.post("", response_model=FleetPublic, status_code=status.HTTP_201_CREATED)
def create_fleet(body: FleetCreate, request: Request, session: SessionDep,
                 settings: SettingsDep, principal: PrincipalDep) -> FleetPublic:
    """Devices the planner predicts will not fit get no job (unless ``allow_infeasible``);
    the fleet says which fit and why the others do not. A federated fleet queues its first
    round; each round's end starts the next."""
    if idle := body.federated_fields_without_aggregation():
        raise invalid(idle[0], f"{idle[0]} needs aggregation fedavg or ffa",
                      getattr(body, idle[0]))
    devices = _device_ids(session, body)
    if body.references:
        _check_references_can_run(body, len(devices))
    common = {name: getattr(body, name) for name in JOB_FIELDS}
    check_references(session, JobCreate(**common, training_file=body.training_file),
                     principal.tenant)
    require_queue(request.app.state.redis)
    # one job per device at most: counted before the shards are written or anything planned
    require_queue_room(session, settings, tenant=principal.tenant, adding=len(devices))
    fleet = Fleet(id=new_id("fleet"), tenant=principal.tenant, model=body.model,
                  spec={})
    files = _shards(session, settings, body, fleet.id, len(devices)) if body.shards_data \
        else [body.training_file] * len(devices)
    try:
        jobs = _plan_members(session, settings, body, fleet, devices, files, principal)
    except BaseException:
        session.rollback()
        if body.shards_data:  # the shards written for a fleet that was not made
            for shard in files:
                dataset_path(settings.storage_root, shard).unlink(missing_ok=True)
        raise
    for job_id in jobs:
        request.app.state.enqueue(job_id)
    return fleet_public(session, fleet)


def _member_job_body(body: FleetCreate, device: str, training_file: str) -> JobCreate:
    """What each device's job asks for: a federated round's local steps, and for ffa only B
    trained (every device shares A's seeded init)."""
    common = {name: getattr(body, name) for name in JOB_FIELDS}
    if body.federated:
        update = {"steps": body.steps_per_round}
        if body.aggregation == "ffa":
            update["lora_freeze_a"] = True
        common["hyperparameters"] = body.hyperparameters.model_copy(update=update)
    return JobCreate(**common, training_file=training_file, device=device)


def _plan_members(session: Session, settings: Settings, body: FleetCreate, fleet: Fleet,
                  devices: list[str], files: list[str], principal) -> list[str]:
    """Plan every device; queue one job per device that fits (or every device, with
    allow_infeasible), or a federated fleet's first round. Commits the fleet and its jobs,
    returns the job ids to enqueue."""
    session.add(fleet)
    session.flush()  # the rows the jobs refer to (the fleet, the shards) go first
    lock_queue(session, principal.tenant)
    members, jobs = [], []
    for index, (device, training_file) in enumerate(zip(devices, files, strict=True)):
        job_body = _member_job_body(body, device, training_file)
        planned = plan_job(job_body, settings, session)
        runs = planned.feasible or body.allow_infeasible
        template = None if not runs else {
            "model": job_body.model,
            "device_id": None if planned.device is None else planned.device.id,
            "memory_budget_bytes": planned.budget_bytes, "plan": planned.plan,
            "config": planned.config.model_dump(mode="json"), "training_file": training_file,
            "validation_file": job_body.validation_file, "metadata_": job_body.metadata}
        job_id = None
        if runs and not body.federated:
            job = insert_job(session, job_body, planned, tenant=principal.tenant,
                             fleet_id=fleet.id)
            jobs.append(job.id)
            job_id = job.id
        members.append({"device": device,
                        "shard": index if body.shards_data else None,
                        "training_file": training_file, "fits": planned.feasible,
                        "examples": session.get(Dataset, training_file).rows,
                        "plan": planned.plan, "job": template, "job_id": job_id})
    fleet.spec = {"request": body.model_dump(mode="json"), "members": members}
    session.add(fleet)
    if body.federated:
        jobs = start_round(session, fleet, 0, settings.storage_root)
    if body.references:
        jobs += queue_references(session, fleet)
    require_queue_room(session, settings, tenant=principal.tenant, adding=0)  # exact now
    session.commit()
    return jobs


@router.get("", response_model=FleetsPublic)
def list_fleets(session: SessionDep, principal: PrincipalDep) -> FleetsPublic:
    fleets = session.exec(select(Fleet).where(Fleet.tenant == principal.tenant)
                          .order_by(Fleet.created_at.desc()).limit(100)).all()
    return FleetsPublic(data=[fleet_public(session, fleet) for fleet in fleets],
                        count=len(fleets))


@router.get("/{fleet_id}", response_model=FleetPublic)
def read_fleet(fleet_id: str, session: SessionDep, principal: PrincipalDep) -> FleetPublic:
    return fleet_public(session, read_fleet_or_404(session, fleet_id, principal))


def read_fleet_or_404(session: Session, fleet_id: str, principal) -> Fleet:
    fleet = session.get(Fleet, fleet_id)
    if fleet is None or fleet.tenant != principal.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no fleet {fleet_id!r}")
    return fleet


def _check_references_can_run(body: FleetCreate, devices: int) -> None:
    if body.validation_file is None:
        raise invalid("references", "references need validation_file: every reference and "
                      "every round's global adapter are scored on it", True)
    steps = reference_steps(devices, body.participation, body.rounds, body.steps_per_round)
    if max(steps) > MAX_STEPS:
        raise invalid("references", f"the centralized reference would train {max(steps)} "
                      f"steps, more than {MAX_STEPS}", True)


def _device_ids(session: Session, body: FleetCreate) -> list[str]:
    if body.simulated is not None:
        device_or_422(session, body.simulated.device, field=("simulated", "device"))
        return [body.simulated.device] * body.simulated.count
    for index, device in enumerate(body.devices):
        device_or_422(session, device, field=("devices", str(index)))
    return body.devices


def _shards(session: Session, settings: Settings, body: FleetCreate, fleet_id: str,
            count: int) -> list[str]:
    """One dataset per device, dealt by the fleet's data split (iid by default)."""
    source = session.get(Dataset, body.training_file)
    field = ("simulated", "count") if body.simulated else "devices"
    if source.rows < count:
        raise invalid(field, f"{count} devices need at least {count} rows; dataset "
                      f"{source.id} has {source.rows}", count)
    split = body.data_split or DataSplit()
    try:
        shards = split_rows(read_rows(Path(source.path).read_bytes()), count,
                            SplitSpec(split.kind, split.field, split.alpha), body.seed)
    except SplitError as exc:
        where = "field" if split.field is not None else "kind"
        raise invalid(("data_split", where), f"{source.filename}: {exc}",
                      getattr(split, where)) from None
    ids = [new_id("ds") for _ in range(count)]
    paths = [dataset_path(settings.storage_root, shard_id) for shard_id in ids]
    stats = write_shards([[row.text for row in shard] for shard in shards], paths)
    for index, (shard_id, path, (size, rows, digest)) in enumerate(zip(ids, paths, stats,
                                                                      strict=True)):
        name = f"{source.filename} (shard {index + 1} of {count}, {fleet_id})"
        session.add(Dataset(id=shard_id, tenant=source.tenant, filename=name[:255],
                            path=str(path), bytes=size, rows=rows, sha256=digest,
                            source_id=source.id))
    return ids


@router.post("/{fleet_id}/cancel", response_model=FleetPublic)
def cancel_fleet(fleet_id: str, session: SessionDep, principal: PrincipalDep) -> FleetPublic:
    """A federated fleet stops after the round in progress and keeps its last global
    adapter; the round's jobs run to their end. Its references that have not ended are
    cancelled."""
    fleet = read_fleet_or_404(session, fleet_id, principal)
    fleet.cancel_requested = True
    session.add(fleet)
    for reference in fleet.spec.get("references", []):
        if session.get(Job, reference["job_id"]).status not in TERMINAL:
            request_cancel(session, reference["job_id"])
    session.commit()
    return fleet_public(session, fleet)


@router.get("/{fleet_id}/rounds/{index}/adapter", response_class=Response,
            responses={200: {"content": {"application/zip": {}, "application/octet-stream": {}},
                             "headers": {"X-Adapter-SHA256": {
                                 "description": "sha256 of the exact bytes served"}}}})
def download_round_adapter(fleet_id: str, index: int, session: SessionDep,
                           settings: SettingsDep, principal: PrincipalDep,
                           format: AdapterFormat = FormatQuery) -> Response:
    """The global adapter round ``index`` combined."""
    fleet = read_fleet_or_404(session, fleet_id, principal)
    current = session.get(FleetRound, (fleet.id, index))
    if current is None or current.status != "done":
        state = "no such round" if current is None else f"round {index} is {current.status}"
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"fleet {fleet_id} has no global adapter for round {index} ({state})")
    source = round_adapter_dir(settings.storage_root, fleet.id, index)
    base_config = source_config(model_source(session, fleet.model))
    return adapter_download(source, format, base_config, f"{fleet_id}-round-{index}")
