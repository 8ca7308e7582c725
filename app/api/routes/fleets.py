"""``/v1/fleets``: one model and dataset across many simulated phones, one job per phone."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Request, status
from fastapi import Path as PathParam
from fastapi.responses import Response
from redis.exceptions import RedisError
from sqlmodel import Session, select

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.api.routes.adapters import AdapterFormat, FormatQuery, adapter_download
from app.api.url_guard import check_webhook_url
from app.fleet_members import (
    JOB_FIELDS,
    check_devices,
    check_population,
    check_round_settings,
    plan_members,
    seats_needed,
)
from app.fleet_schemas import DataSplit, FleetCreate, FleetPublic, FleetsPublic
from app.fleet_summary import fleet_public
from app.job_schemas import JobCreate
from app.submit import check_references, lock_queue, require_queue, require_queue_room
from mebp_core.federated.split import SplitError
from mebp_core.plan.arch import Architecture
from mebp_core.store.model_source import source_config
from service.crud import TERMINAL, request_cancel
from service.federation import rounds_of
from service.fleet_shards import (
    CANCELLED,
    FAILED,
    PREPARING,
    READY,
    Shards,
    deal_shards,
    make_fleet_jobs,
    splits_in_request,
)
from service.fleet_spec import MAX_ROUNDS, FleetRequest, FleetSpec
from service.models import Dataset, Fleet, FleetRound, Job
from service.queue import enqueue_prepare, job_queue
from service.registry import model_source
from service.settings import Settings
from service.storage import new_id, round_adapter_dir

router = APIRouter(prefix="/fleets", tags=["fleets"])
RoundIndex = Annotated[int, PathParam(ge=0, lt=MAX_ROUNDS, description="the round, from 0")]


@router.post("", response_model=FleetPublic, status_code=status.HTTP_201_CREATED,
             responses={202: {"model": FleetPublic, "description": "preparing: a worker "
                              "deals its rows into its devices' shards and queues its jobs"}})
def create_fleet(body: FleetCreate, request: Request, response: Response, session: SessionDep,
                 settings: SettingsDep, principal: PrincipalDep) -> FleetPublic:
    """Devices the planner predicts will not fit get no job and no shard (unless
    ``allow_infeasible``); the fleet says which fit and why the others do not. A federated
    fleet queues its first round; each round's end starts the next. A training file too
    large to split within the request is split by a worker: a 202, the fleet preparing."""
    check_webhook_url(body.webhook_url, request, settings)
    devices = check_devices(session, body)
    check_population(body)
    check_round_settings(body, devices)
    source, arch = _source(session, body, principal.tenant, devices)
    require_queue(request.app.state.redis)
    stored = FleetRequest.model_validate(body.model_dump(mode="json",
                                                         exclude={"webhook_url"}))
    members, population = plan_members(session, settings, body, source, arch)  # once a profile
    spec = FleetSpec(request=stored, members=members, population=population)
    seats = seats_needed(body, spec)
    require_queue_room(session, settings, tenant=principal.tenant, adding=seats)
    session.expunge(source)
    session.commit()  # no transaction open while the shards are dealt and written
    deal = body.shards_data and seats > 0
    on_worker = deal and not splits_in_request(source, settings)
    fleet = Fleet(id=new_id("fleet"), tenant=principal.tenant, model=body.model, spec=spec,
                  status=PREPARING if on_worker else READY, reserved_jobs=seats,
                  webhook_url=None if body.webhook_url is None else str(body.webhook_url))
    shards = _deal(settings, source, fleet, body) if deal and not on_worker else None
    try:
        lock_queue(session, principal.tenant)
        session.add(fleet)  # written with its jobs' rows, each built first
        jobs = [] if on_worker else make_fleet_jobs(session, fleet, shards,
                                                    settings.storage_root)
        require_queue_room(session, settings, tenant=principal.tenant, adding=0)  # exact now
        session.commit()
    except BaseException:
        session.rollback()
        if shards is not None:
            shards.remove()
        raise
    if on_worker:
        _enqueue_preparation(request, session, settings, fleet)
        response.status_code = status.HTTP_202_ACCEPTED
    for job_id in jobs:
        request.app.state.enqueue(job_id)
    return fleet_public(session, fleet)


def _source(session: Session, body: FleetCreate, tenant: str, devices: int
            ) -> tuple[Dataset, Architecture]:
    """The training file and the model's architecture (resolved once for every device's
    plan), once the request's datasets and model are known to exist."""
    common = {name: getattr(body, name) for name in JOB_FIELDS}
    arch = check_references(session, JobCreate(**common, training_file=body.training_file),
                            tenant)
    source = session.get(Dataset, body.training_file)
    if body.shards_data and source.rows < devices:
        field = ("simulated", "count") if body.simulated else "devices"
        raise invalid(field, f"{devices} devices need at least {devices} rows; dataset "
                      f"{source.id} has {source.rows}", devices)
    return source, arch


def _deal(settings: Settings, source: Dataset, fleet: Fleet, body: FleetCreate) -> Shards:
    try:
        return deal_shards(settings.storage_root, source, fleet)
    except SplitError as exc:
        split = body.data_split or DataSplit()
        where = "field" if split.field is not None else "kind"
        raise invalid(("data_split", where), f"{source.filename}: {exc}",
                      getattr(split, where)) from None


def _enqueue_preparation(request: Request, session: Session, settings: Settings,
                         fleet: Fleet) -> None:
    """A fleet no worker will hear of ends failed, its seats given back (and a 503)."""
    try:
        enqueue_prepare(job_queue(request.app.state.redis, settings.queue_name), fleet.id)
    except RedisError:
        fleet.status, fleet.reserved_jobs = FAILED, 0
        fleet.error = "the job queue was unavailable as it was made; make it again"
        session.add(fleet)
        session.commit()
        raise


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


@router.post("/{fleet_id}/cancel", response_model=FleetPublic)
def cancel_fleet(fleet_id: str, session: SessionDep, principal: PrincipalDep) -> FleetPublic:
    """A federated fleet stops after the round in progress and keeps its last global
    adapter; the round's jobs run to their end. Its other jobs that have not ended (a
    federated fleet's references, every job of a fleet without rounds) are cancelled. A
    preparing fleet ends cancelled before its jobs are made."""
    fleet = read_fleet_or_404(session, fleet_id, principal)
    fleet.cancel_requested = True
    fleet.reserved_jobs = 0  # no later round, nor its preparation, will queue jobs
    if fleet.status == PREPARING:
        fleet.status = CANCELLED
    session.add(fleet)
    round_jobs = {seat.job_id for current in rounds_of(session, fleet.id)
                  for seat in current.participants}
    for job_id, job_status in session.exec(select(Job.id, Job.status)
                                           .where(Job.fleet_id == fleet.id)).all():
        if job_status not in TERMINAL and job_id not in round_jobs:
            request_cancel(session, job_id)
    session.commit()
    return fleet_public(session, fleet)


@router.get("/{fleet_id}/rounds/{index}/adapter", response_class=Response,
            responses={200: {"content": {"application/zip": {}, "application/octet-stream": {}},
                             "headers": {"X-Adapter-SHA256": {
                                 "description": "sha256 of the exact bytes served"}}}})
def download_round_adapter(fleet_id: str, index: RoundIndex, session: SessionDep,
                           settings: SettingsDep, principal: PrincipalDep,
                           format: AdapterFormat = FormatQuery) -> Response:
    """The global adapter round ``index`` combined."""
    fleet = read_fleet_or_404(session, fleet_id, principal)
    current = session.get(FleetRound, (fleet.id, index))
    if current is None or current.status != "done":
        state = "no such round" if current is None else f"round {index} is {current.status}"
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"fleet {fleet_id} has no global adapter for round {index} ({state})")
    base_config = source_config(model_source(session, fleet.model))
    return adapter_download(session, round_adapter_dir(settings.storage_root, fleet.id, index),
                            format, base_config, f"{fleet_id}-round-{index}",
                            gone=f"fleet {fleet_id}'s round {index} adapter is no longer stored")
