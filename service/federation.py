"""Federated fleets, round by round: the coordinator's state machine.

A round selects devices (``mebp_core.federated.rounds``), queues one normal job per selected
device that is neither a straggler nor offline from the start, each starting from the previous
round's global adapter; when every one of them has ended, the updates of those that trained
(not dropped, not out of memory) are combined into the round's global adapter, which is
evaluated, and the next round starts. ``advance`` is safe to run any number of times, from
any process: coordinators take turns, a round turns done once (its row is updated under a
lock, and the adapter it writes is the same bytes however often it is written), so no
update is counted twice. A fleet holds seats in its tenant's queue for its later rounds
(``Fleet.reserved_jobs``) until its last round is queued or it stops, so no round it queues
passes the tenant's queued-jobs limit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from safetensors import safe_open
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from mebp_core.atomic import exclusive_lock
from mebp_core.federated.rounds import fate, is_straggler, participants, reference_steps
from mebp_core.lora.peft_files import CONFIG_NAME, WEIGHTS_NAME
from service.crud import TERMINAL, create_queued_jobs, latest_adapter
from service.fleet_spec import FleetRequest, JobTemplate, ReferenceRecord, RoundSeat
from service.json_column import MalformedRowError, rows_that_load
from service.models import Fleet, FleetRound, Job, utc_now
from service.shard_files import write_missing_shards
from service.storage import coordinator_lock_path, round_adapter_dir

RUNNING, DONE, FAILED = "running", "done", "failed"
# what became of a selected device
TRAINING, TRAINED, DROPPED, OUT_OF_MEMORY, STRAGGLER, DOES_NOT_FIT = (
    "training", "trained", "dropped", "out_of_memory", "straggler", "does_not_fit")

log = logging.getLogger("mebp.federation")
REFERENCE_PRIORITY = -1  # a reference run waits behind every queued job of a round
Evaluate = Callable[[Fleet, Path], float | None]


def rounds_of(session: Session, fleet_id: str) -> list[FleetRound]:
    return list(session.exec(select(FleetRound).where(FleetRound.fleet_id == fleet_id)
                             .order_by(FleetRound.index)))


def start_round(session: Session, fleet: Fleet, index: int, storage_root: Path) -> list[str]:
    """Add round ``index`` and the jobs of its selected devices; the caller commits, then
    enqueues the returned job ids. A population's phones drawn for the first time have their
    shard files written here, before their rows; no SQLite write may be open meanwhile
    (``make_fleet_jobs`` finds round 0's written already; ``_advance`` holds its ended
    round's row back with ``no_autoflush``)."""
    request, spec = fleet.spec.request, fleet.spec
    local_steps = request.steps_per_round
    init = None if index == 0 else str(round_adapter_dir(storage_root, fleet.id, index - 1))
    if init is not None and not Path(init).is_dir():
        init = _last_global_adapter(session, fleet, storage_root)
    seats, rows = [], []
    cursors = data_cursors(session, fleet.id)
    trainees = []
    for member in participants(spec.member_count, request.participation, request.seed, index):
        phone = spec.member(member, fleet.id)
        estimate = phone.plan.device_step_time_s_estimate
        device_time_s = None if estimate is None else estimate * local_steps
        offline = fate(request.seed, index, member, request.dropout,
                       local_steps).offline_after_step
        if phone.job is None:
            outcome = DOES_NOT_FIT
        elif is_straggler(device_time_s, request.deadline_s):
            outcome = STRAGGLER
        elif offline == 0:
            outcome = DROPPED
        else:
            outcome = TRAINING
            trainees.append(member)
            rows.append(_round_job(phone.job, request, offline or local_steps,
                                   cursors.get(member, 0)))
        seats.append(RoundSeat(member=member, job_id=None, outcome=outcome,
                               examples=phone.examples, offline_after_step=offline,
                               device_time_s=device_time_s))
    if spec.population is not None:  # a phone's shard is written when it first trains
        write_missing_shards(session, fleet, trainees, storage_root)
    jobs = iter(create_queued_jobs(session, rows, tenant=fleet.tenant, fleet_id=fleet.id,
                                   init_adapter=init))
    seats = [seat.model_copy(update={"job_id": next(jobs).id})
             if seat.outcome == TRAINING else seat for seat in seats]
    session.add(FleetRound(fleet_id=fleet.id, index=index, status=RUNNING, participants=seats))
    return [seat.job_id for seat in seats if seat.outcome == TRAINING]


def _round_job(template: JobTemplate, request: FleetRequest, steps: int,
               cursor: int) -> dict:
    """A device's job in a round: ``steps`` from where its earlier rounds left its shard's
    stream; it scores no validation file, or the fleet's bounded sample of it."""
    sample = request.device_validation_rows
    return template.job_row(
        config={"steps": steps, "data_start_batch": cursor, "validation_rows": sample},
        validation_file=None if sample is None else template.validation_file)


def data_cursors(session: Session, fleet_id: str) -> dict[int, int]:
    """Where each member's next round starts in its shard's batch stream: where its latest
    round job stopped (its start plus the micro-batches its steps drew), read from the
    jobs' rows, so a coordinator that restarts finds the same."""
    latest: dict[int, str] = {}
    for earlier in rounds_of(session, fleet_id):
        latest |= {seat.member: seat.job_id for seat in earlier.participants
                   if seat.job_id is not None}
    cursors = {}
    for member, job_id in latest.items():
        job = session.get(Job, job_id)
        config = job.train_config()
        cursors[member] = config.data_start_batch + job.step * config.grad_accum_steps
    return cursors


def queue_references(session: Session, fleet: Fleet) -> list[str]:
    """Queue the fleet's references, each a normal job from scratch: every device that fits
    alone on its shard (local-only) and one run on the whole training file (centralized,
    with the first such device's configuration and cap); records them in the fleet's spec
    and returns the job ids. The caller commits, then enqueues. They are claimed after any
    queued job of the fleet's rounds (``REFERENCE_PRIORITY``), so they never hold a round
    up waiting for a worker."""
    request, spec = fleet.spec.request, fleet.spec
    local_steps, central_steps = reference_steps(
        spec.member_count, request.participation, request.rounds, request.steps_per_round)
    members = (spec.member(index, fleet.id) for index in range(spec.member_count))
    templates = [(index, member.job) for index, member in enumerate(members)
                 if member.job is not None]
    runs = [("local_only", index, job.job_row(config={"steps": local_steps}))
            for index, job in templates]
    if templates:  # with the first such device's configuration and cap
        runs.append(("centralized", None, templates[0][1].job_row(
            config={"steps": central_steps}, training_file=request.training_file)))
    jobs = create_queued_jobs(session, [row for _, _, row in runs], tenant=fleet.tenant,
                              fleet_id=fleet.id, priority=REFERENCE_PRIORITY)
    references = [ReferenceRecord(kind=kind, member=member, job_id=job.id)
                  for (kind, member, _), job in zip(runs, jobs, strict=True)]
    fleet.spec = fleet.spec.model_copy(update={"references": references})
    session.add(fleet)
    return [reference.job_id for reference in references]


def advance(session: Session, fleet_id: str, storage_root: Path, evaluate: Evaluate
            ) -> list[str]:
    """Finish the fleet's current round if all its jobs have ended, and start the next;
    returns the job ids to enqueue (none while the round is still training). A round in
    which nobody trains (stragglers, devices offline or too small) ends at once.

    Coordinators take turns: on one machine by a file lock, which also serializes them on
    SQLite (where a row lock is a no-op), and across machines by the fleet's row lock. The
    session must not be inside a transaction yet, so that it reads what the one before
    committed."""
    with exclusive_lock(coordinator_lock_path(storage_root, fleet_id)):
        return _advance(session, fleet_id, storage_root, evaluate)


def _advance(session: Session, fleet_id: str, storage_root: Path, evaluate: Evaluate
             ) -> list[str]:
    while True:  # a pass per round started; each commit ends the row lock, each pass retakes it
        fleet = session.exec(select(Fleet).where(Fleet.id == fleet_id)
                             .with_for_update()).first()
        if fleet is None or not fleet.spec.request.federated:
            return []
        rounds = rounds_of(session, fleet_id)
        if not rounds:
            return []
        current = rounds[-1]
        if current.status == RUNNING:
            seats = _outcomes(session, current)
            if any(seat.outcome == TRAINING for seat in seats):
                session.rollback()
                return []
            _finish_round(session, fleet, current, seats, storage_root, evaluate)
        last = fleet.spec.request.rounds - 1
        if current.index >= last or fleet.cancel_requested:
            _release_seats(session, fleet)
            session.commit()
            return []
        with session.no_autoflush:  # the ended round's row waits for the shard files
            jobs = start_round(session, fleet, current.index + 1, storage_root)
        if current.index + 1 == last:
            _release_seats(session, fleet)  # its last round's jobs have taken their seats
        try:
            session.commit()
        except IntegrityError:  # another coordinator started it first
            session.rollback()
            return []
        if jobs:
            return jobs


def _release_seats(session: Session, fleet: Fleet) -> None:
    """The fleet queues no round after this one: the seats it held in its tenant's queue for
    later rounds (``Fleet.reserved_jobs``) are free."""
    fleet.reserved_jobs = 0
    session.add(fleet)


def stalled(session: Session, grace_s: float) -> list[str]:
    """Fleets whose running round has had no job left to end for ``grace_s``: their
    coordinator was lost (or never asked), so they need moving on."""
    fleets = []
    cutoff = utc_now() - timedelta(seconds=grace_s)
    for current in rows_that_load(session, select(FleetRound)
                                  .where(FleetRound.status == RUNNING)):
        try:
            jobs = [session.get(Job, seat.job_id) for seat in current.participants
                    if seat.outcome == TRAINING]
        except MalformedRowError as exc:
            log.warning("fleet %s round %d left as it is: %s", current.fleet_id,
                        current.index, exc)
            continue
        if any(job.status not in TERMINAL for job in jobs):
            continue
        ended = max([_aware(job.finished_at or current.started_at) for job in jobs],
                    default=_aware(current.started_at))
        if ended < cutoff:
            fleets.append(current.fleet_id)
    return fleets


def _aware(moment: datetime) -> datetime:
    """SQLite hands datetimes back without their zone; they were stored in UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _outcomes(session: Session, current: FleetRound) -> list[RoundSeat]:
    seats = []
    for seat in current.participants:
        if seat.outcome == TRAINING:
            job = session.get(Job, seat.job_id)
            if job.status in TERMINAL:
                seat = seat.model_copy(update={"outcome": _outcome(job, seat)})
        seats.append(seat)
    return seats


def _outcome(job: Job, seat: RoundSeat) -> str:
    if job.status == "succeeded":
        return DROPPED if seat.offline_after_step is not None else TRAINED
    if job.error_code == "memory_budget_exceeded":
        return OUT_OF_MEMORY
    return job.status  # failed or cancelled


def _finish_round(session: Session, fleet: Fleet, current: FleetRound, seats: list[RoundSeat],
                  storage_root: Path, evaluate: Evaluate) -> None:
    trained = [seat for seat in seats if seat.outcome == TRAINED]
    out = round_adapter_dir(storage_root, fleet.id, current.index)
    if trained:
        adapters = {seat.member: latest_adapter(session, seat.job_id).path for seat in trained}
        combine(adapters, [seat.examples for seat in trained], fleet.spec.request.aggregation,
                out)
        current.eval_loss = evaluate(fleet, out)
        current.simulated_wall_s = max((seat.device_time_s or 0.0) for seat in trained)
    current.participants = seats
    current.status = DONE if trained else FAILED
    current.finished_at = utc_now()
    session.add(current)


def combine(adapters: dict[int, str], examples: list[int], how: str, out: Path) -> Path:
    """The global adapter of the members' adapters (member -> directory) at ``out``."""
    # torch, imported where a round is combined (a coordinator), not by the API
    from mebp_core.federated.aggregate import Update, aggregate
    from mebp_core.lora.peft_io import load_peft_adapter, save_peft_adapter

    updates = []
    for (member, directory), count in zip(adapters.items(), examples, strict=True):
        _, tensors = load_peft_adapter(directory)
        updates.append(Update(f"device {member}", tensors, count))
    first = Path(next(iter(adapters.values())))
    spec, _ = load_peft_adapter(first)
    config = json.loads((first / CONFIG_NAME).read_text())
    with safe_open(first / WEIGHTS_NAME, "pt") as weights:
        model_type = (weights.metadata() or {}).get("model_type")
    return save_peft_adapter(out, aggregate(updates, how), spec,
                             base_model_name_or_path=config["base_model_name_or_path"],
                             model_type=model_type, target_modules=config["target_modules"])


def _last_global_adapter(session: Session, fleet: Fleet, storage_root: Path) -> str | None:
    """The newest round that combined an update (a failed round adds none)."""
    for done in reversed(rounds_of(session, fleet.id)):
        if done.status == DONE:
            return str(round_adapter_dir(storage_root, fleet.id, done.index))
    return None
