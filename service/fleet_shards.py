"""Preparing a fleet: its rows dealt to its devices (``mebp_core.federated.split``), a shard
written only for each device that gets a job, then, in one short transaction, the shards'
rows, the fleet's jobs (or its first round and references) and its status.

The API prepares a fleet whose training file is small within the request; a larger one is
prepared by a worker (``worker.fleet_split``) while the fleet is ``preparing``. Either way
nothing slow runs inside a transaction: dealing and writing come first, the rows after."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session

from mebp_core.federated.rounds import participants
from service.crud import create_queued_jobs
from service.federation import queue_references, start_round
from service.fleet_spec import FleetMemberSpec, FleetSpec, shard_id
from service.models import Dataset, Fleet
from service.settings import Settings
from service.shard_files import deal, write_member_shards
from service.storage import new_id

PREPARING, READY, FAILED, CANCELLED = "preparing", "ready", "failed", "cancelled"
INLINE_SPLIT_BYTES = 16 << 20  # dealt and written in well under a second


def splits_in_request(source: Dataset, settings: Settings) -> bool:
    """Whether a fleet's rows are few enough to deal within its request (else a worker)."""
    return source.rows <= settings.fleet_inline_split_rows and \
        source.bytes <= INLINE_SPLIT_BYTES


@dataclass
class Shards:
    rows: list[int]  # every device's rows, written or not (a federated device's weight)
    datasets: list[Dataset]  # the shards written: one per device that gets a job

    def remove(self) -> None:
        """The files written, for a fleet that was not made."""
        for dataset in self.datasets:
            Path(dataset.path).unlink(missing_ok=True)


def deal_shards(storage_root: Path, source: Dataset, fleet: Fleet) -> Shards:
    """Deal the source's rows by the fleet's data split (iid by default) and write the
    shards its jobs need now: every member's that has a job, or, for a federated population,
    those of its first round's cohort (a later round writes its own, ``start_round``).
    ``SplitError`` names the line or field."""
    dealt = deal(source, fleet)
    wanted = [index for index in shards_needed_now(fleet)
              if fleet.spec.member(index, fleet.id).job is not None]
    return Shards([len(shard) for shard in dealt],
                  write_member_shards(storage_root, source, fleet, dealt, wanted))


def shards_needed_now(fleet: Fleet) -> range | list[int]:
    request, spec = fleet.spec.request, fleet.spec
    if spec.population is None or not request.federated or request.references:
        return range(spec.member_count)
    return participants(spec.member_count, request.participation, request.seed, 0)


def make_fleet_jobs(session: Session, fleet: Fleet, shards: Shards | None,
                    storage_root: Path) -> list[str]:
    """Add the shards' rows and the fleet's jobs (a federated fleet's first round and its
    references), and mark it ready; returns the job ids to enqueue once the caller has
    committed. The jobs take the seats the fleet holds; a federated fleet keeps holding
    seats for its later rounds."""
    request = fleet.spec.request
    if shards is not None:
        session.add_all(shards.datasets)
    # all set before the fleet's row is written (with the jobs' rows)
    fleet.spec = _dealt(fleet.spec, shards, fleet.id)
    fleet.status = READY
    if not request.federated or request.rounds == 1:
        fleet.reserved_jobs = 0  # every job it will make is made here
    session.add(fleet)
    runs = [] if request.federated else [member.job.job_row(id=member.job_id)
                                         for member in fleet.spec.members
                                         if member.job is not None]
    jobs = [job.id for job in create_queued_jobs(session, runs, tenant=fleet.tenant,
                                                 fleet_id=fleet.id)]
    if request.federated:
        jobs = start_round(session, fleet, 0, storage_root)
        if request.references:
            jobs += queue_references(session, fleet)
    return jobs


def _dealt(spec: FleetSpec, shards: Shards | None, fleet_id: str) -> FleetSpec:
    """The fleet once its rows are dealt: each member's count and, if it has a job, its
    shard; a fleet without rounds, each job's id."""
    if spec.population is not None:
        if shards is None:
            return spec
        return spec.model_copy(update={"population": spec.population.model_copy(
            update={"examples": shards.rows})})
    members = spec.members
    if shards is not None:
        members = [_dealt_member(member, rows, fleet_id)
                   for member, rows in zip(members, shards.rows, strict=True)]
    if not spec.request.federated:
        members = [member if member.job is None else
                   member.model_copy(update={"job_id": new_id("job")}) for member in members]
    return spec.model_copy(update={"members": members})


def _dealt_member(member: FleetMemberSpec, rows: int, fleet_id: str) -> FleetMemberSpec:
    """A listed member once its rows are dealt: its count, and its shard if it has a job."""
    if member.job is None:
        return member.model_copy(update={"examples": rows})
    shard = shard_id(fleet_id, member.shard)
    return member.model_copy(update={
        "examples": rows, "training_file": shard,
        "job": member.job.model_copy(update={"training_file": shard})})
