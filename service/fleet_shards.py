"""Preparing a fleet: its rows dealt to its devices (``mebp_core.federated.split``), a shard
written only for each device that gets a job, then, in one short transaction, the shards'
rows, the fleet's jobs (or its first round and references) and its status.

The API prepares a fleet whose training file is small within the request; a larger one is
prepared by a worker (``worker.fleet_split``) while the fleet is ``preparing``. Either way
nothing slow runs inside a transaction: dealing and writing come first, the rows after."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session

from mebp_core.federated.split import SplitSpec, read_rows, split_rows
from service.crud import create_queued_jobs
from service.federation import queue_references, start_round
from service.fleet_spec import FleetMemberSpec
from service.models import Dataset, Fleet
from service.settings import Settings
from service.storage import dataset_path, new_id, write_shards

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


def shard_id(fleet_id: str, index: int) -> str:
    """Device ``index``'s shard: the same id each time the fleet is prepared, so a second
    preparation writes over the first's files rather than beside them."""
    return f"ds-{fleet_id.removeprefix('fleet-')}-{index}"


def deal_shards(storage_root: Path, source: Dataset, fleet: Fleet) -> Shards:
    """Deal the source's rows by the fleet's data split (iid by default) and write the
    shard of each member that has a job. ``SplitError`` names the line or field."""
    request, members = fleet.spec.request, fleet.spec.members
    dealt = split_rows(read_rows(Path(source.path).read_bytes()), len(members),
                       request.data_split or SplitSpec(), request.seed)
    wanted = [index for index, member in enumerate(members) if member.job is not None]
    ids = [shard_id(fleet.id, index) for index in wanted]
    paths = [dataset_path(storage_root, shard) for shard in ids]
    try:
        stats = write_shards([[row.text for row in dealt[index]] for index in wanted], paths)
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise
    datasets = []
    for index, shard, path, (size, rows, digest) in zip(wanted, ids, paths, stats,
                                                        strict=True):
        name = f"{source.filename} (shard {index + 1} of {len(members)}, {fleet.id})"
        datasets.append(Dataset(id=shard, tenant=source.tenant, filename=name[:255],
                                path=str(path), bytes=size, rows=rows, sha256=digest,
                                source_id=source.id))
    return Shards([len(shard) for shard in dealt], datasets)


def make_fleet_jobs(session: Session, fleet: Fleet, shards: Shards | None,
                    storage_root: Path) -> list[str]:
    """Add the shards' rows and the fleet's jobs (a federated fleet's first round and its
    references), and mark it ready; returns the job ids to enqueue once the caller has
    committed. The jobs take the seats the fleet holds; a federated fleet keeps holding
    seats for its later rounds."""
    request, members = fleet.spec.request, fleet.spec.members
    if shards is not None:
        session.add_all(shards.datasets)
        written = iter(shards.datasets)
        members = [_dealt(member, rows, written) for member, rows in zip(members, shards.rows,
                                                                        strict=True)]
    if not request.federated:
        members = [member if member.job is None else
                   member.model_copy(update={"job_id": new_id("job")}) for member in members]
    # all set before the fleet's row is written (with the jobs' rows)
    fleet.spec = fleet.spec.model_copy(update={"members": members})
    fleet.status = READY
    if not request.federated or request.rounds == 1:
        fleet.reserved_jobs = 0  # every job it will make is made here
    session.add(fleet)
    runs = [] if request.federated else [member.job.job_row(id=member.job_id)
                                         for member in members if member.job is not None]
    jobs = [job.id for job in create_queued_jobs(session, runs, tenant=fleet.tenant,
                                                 fleet_id=fleet.id)]
    if request.federated:
        jobs = start_round(session, fleet, 0, storage_root)
        if request.references:
            jobs += queue_references(session, fleet)
    return jobs


def _dealt(member: FleetMemberSpec, rows: int, written: Iterator[Dataset]) -> FleetMemberSpec:
    """A member once its rows are dealt: its count, and its shard if it has a job."""
    if member.job is None:
        return member.model_copy(update={"examples": rows})
    shard = next(written).id
    return member.model_copy(update={
        "examples": rows, "training_file": shard,
        "job": member.job.model_copy(update={"training_file": shard})})
