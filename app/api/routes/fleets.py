"""``/v1/fleets``: one model and dataset across many simulated phones, one job per phone."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, status
from sqlmodel import Session, select

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.fleet_summary import fleet_public
from app.planning import device_or_422, plan_job
from app.schemas import FleetCreate, FleetPublic, FleetsPublic, JobCreate
from app.submit import (
    check_references,
    insert_job,
    lock_queue,
    require_queue,
    require_queue_room,
)
from service.models import Dataset, Fleet
from service.settings import Settings
from service.storage import dataset_path, new_id, write_shards

router = APIRouter(prefix="/fleets", tags=["fleets"])
JOB_FIELDS = ("model", "validation_file", "memory_budget_mb", "method", "hyperparameters",
              "config", "seed", "metadata", "allow_infeasible")


@router.post("", response_model=FleetPublic, status_code=status.HTTP_201_CREATED)
def create_fleet(body: FleetCreate, request: Request, session: SessionDep,
                 settings: SettingsDep, principal: PrincipalDep) -> FleetPublic:
    """Devices the planner predicts will not fit get no job (unless ``allow_infeasible``);
    the fleet says which fit and why the others do not."""
    devices = _device_ids(session, body)
    common = {name: getattr(body, name) for name in JOB_FIELDS}
    check_references(session, JobCreate(**common, training_file=body.training_file),
                     principal.tenant)
    require_queue(request.app.state.redis)
    # one job per device at most: counted before the shards are written or anything planned
    require_queue_room(session, settings, tenant=principal.tenant, adding=len(devices))
    fleet = Fleet(id=new_id("fleet"), tenant=principal.tenant, model=body.model,
                  spec={})
    files = _shards(session, settings, body, fleet.id) if body.simulated else \
        [body.training_file] * len(devices)
    try:
        jobs = _plan_members(session, settings, body, fleet, devices, files, principal)
    except BaseException:
        session.rollback()
        if body.simulated:  # the shards written for a fleet that was not made
            for shard in files:
                dataset_path(settings.storage_root, shard).unlink(missing_ok=True)
        raise
    for job_id in jobs:
        request.app.state.enqueue(job_id)
    return fleet_public(session, fleet)


def _plan_members(session: Session, settings: Settings, body: FleetCreate, fleet: Fleet,
                  devices: list[str], files: list[str], principal) -> list[str]:
    """One planned job per device that fits (or every device, with allow_infeasible);
    commits the fleet and its jobs, returns the job ids to enqueue."""
    session.add(fleet)
    session.flush()  # the rows the jobs refer to (the fleet, the shards) go first
    lock_queue(session, principal.tenant)
    common = {name: getattr(body, name) for name in JOB_FIELDS}
    members, jobs = [], []
    for index, (device, training_file) in enumerate(zip(devices, files, strict=True)):
        job_body = JobCreate(**common, training_file=training_file, device=device)
        planned = plan_job(job_body, settings, session)
        job = None
        if planned.feasible or body.allow_infeasible:
            job = insert_job(session, job_body, planned, tenant=principal.tenant,
                             fleet_id=fleet.id)
            jobs.append(job.id)
        members.append({"device": device, "shard": index if body.simulated else None,
                        "training_file": training_file, "fits": planned.feasible,
                        "plan": planned.plan, "job_id": None if job is None else job.id})
    fleet.spec = {"request": body.model_dump(mode="json"), "members": members}
    session.add(fleet)
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
    fleet = session.get(Fleet, fleet_id)
    if fleet is None or fleet.tenant != principal.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no fleet {fleet_id!r}")
    return fleet_public(session, fleet)


def _device_ids(session: Session, body: FleetCreate) -> list[str]:
    if body.simulated is not None:
        device_or_422(session, body.simulated.device, field=("simulated", "device"))
        return [body.simulated.device] * body.simulated.count
    for index, device in enumerate(body.devices):
        device_or_422(session, device, field=("devices", str(index)))
    return body.devices


def _shards(session: Session, settings: Settings, body: FleetCreate, fleet_id: str) -> list[str]:
    """One dataset per simulated phone: the rows dealt round-robin."""
    source = session.get(Dataset, body.training_file)
    count = body.simulated.count
    if source.rows < count:
        raise invalid(("simulated", "count"), f"{count} phones need at least {count} rows; "
                      f"dataset {source.id} has {source.rows}", count)
    ids = [new_id("ds") for _ in range(count)]
    paths = [dataset_path(settings.storage_root, shard_id) for shard_id in ids]
    stats = write_shards(Path(source.path), paths)
    for index, (shard_id, path, (size, rows, digest)) in enumerate(zip(ids, paths, stats,
                                                                      strict=True)):
        name = f"{source.filename} (shard {index + 1} of {count}, {fleet_id})"
        session.add(Dataset(id=shard_id, tenant=source.tenant, filename=name[:255],
                            path=str(path), bytes=size, rows=rows, sha256=digest,
                            source_id=source.id))
    return ids
