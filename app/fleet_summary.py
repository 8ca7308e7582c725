"""A fleet as the API shows it: its members' plans and jobs (a page of them at a time), what
the fleet came to, and each round summed up over its cohort."""

from __future__ import annotations

from collections import Counter
from statistics import mean, median

from sqlmodel import Session, col, select

from app.fleet_schemas import (
    LISTED_MEMBERS,
    FleetMember,
    FleetPublic,
    FleetReferences,
    FleetRoundPublic,
    FleetSummary,
    ReferenceRun,
    RoundParticipant,
    RoundSummary,
    Spread,
)
from app.fleet_status import fleet_status
from mebp_core.plan.summary import PlanSummary
from mebp_core.units import MB
from service.crud import TERMINAL
from service.federation import rounds_of
from service.fleet_shards import PREPARING
from service.fleet_spec import FleetMemberSpec, FleetSpec, ReferenceRecord
from service.models import Fleet, FleetRound, Job, Metric

# what the summaries read of every job of a fleet (not its config nor plan)
Facts = tuple[str, str, str | None, float | None, int | None]  # id, status, code, loss, peak


def fleet_public(session: Session, fleet: Fleet) -> FleetPublic:
    rounds = rounds_of(session, fleet.id)
    facts = job_facts(session, fleet.id)
    latest = latest_jobs(rounds)
    request, spec = fleet.spec.request, fleet.spec
    references = spec.references or []
    full = jobs_by_id(session, [ref.job_id for ref in references])
    return FleetPublic(id=fleet.id, model=fleet.model, method=request.method,
                       aggregation=request.aggregation,
                       planned_rounds=request.rounds if request.federated else None,
                       local_steps=request.steps_per_round if request.federated else None,
                       created_at=fleet.created_at,
                       status=fleet_status(fleet, rounds, (row[1] for row in facts.values())),
                       cancel_requested=fleet.cancel_requested, error=fleet.error,
                       members=members_page(session, fleet, 0, LISTED_MEMBERS, latest),
                       summary=_summary(fleet, facts, latest),
                       rounds=[round_public(r, fleet, facts) for r in rounds],
                       references=None if spec.references is None else
                       _references(session, references, full, rounds),
                       metadata=request.metadata, webhook_url=fleet.webhook_url)


def job_facts(session: Session, fleet_id: str) -> dict[str, Facts]:
    return {row[0]: tuple(row) for row in session.exec(
        select(Job.id, Job.status, Job.error_code, Job.last_loss, Job.peak_memory_bytes)
        .where(Job.fleet_id == fleet_id))}


def latest_jobs(rounds: list[FleetRound]) -> dict[int, str]:
    """Each federated member's latest round's job."""
    return {seat.member: seat.job_id for r in rounds for seat in r.participants
            if seat.job_id is not None}


def jobs_by_id(session: Session, ids: list[str]) -> dict[str, Job]:
    return {job.id: job for job in session.exec(select(Job).where(col(Job.id).in_(ids)))} \
        if ids else {}


def members_page(session: Session, fleet: Fleet, start: int, stop: int,
                 latest: dict[int, str]) -> list[FleetMember]:
    """Members ``start`` to ``stop`` (not included), each with its latest job."""
    spec = fleet.spec
    indices = range(start, min(stop, spec.member_count))
    specs = [spec.member(index, fleet.id) for index in indices]
    job_ids = [member.job_id or latest.get(index)
               for index, member in zip(indices, specs, strict=True)]
    jobs = jobs_by_id(session, [job_id for job_id in job_ids if job_id is not None])
    preparing = fleet.status == PREPARING
    return [_member(index, member, jobs.get(job_id), preparing, spec.population is not None)
            for index, member, job_id in zip(indices, specs, job_ids, strict=True)]


def _summary(fleet: Fleet, facts: dict[str, Facts], latest: dict[int, str]) -> FleetSummary:
    spec = fleet.spec
    kinds = _member_kinds(spec)
    statuses, codes, losses = Counter(), Counter(), []
    for index in range(spec.member_count):
        member = kinds(index)
        row = facts.get(member.job_id or latest.get(index))
        if row is None:
            preparing = fleet.status == PREPARING and member.job is not None
            statuses["preparing" if preparing else "not_run"] += 1
            continue
        _, status, code, loss, _ = row
        statuses[status] += 1
        if code:
            codes[code] += 1
        if status == "succeeded" and loss:
            losses.append(loss)
    by_device = Counter(kinds(index).device for index in range(spec.member_count)) \
        if spec.population is None else \
        dict(zip((p.device for p in spec.population.profiles), spec.population.counts,
                 strict=True))
    fits = sum(kinds(index).fits for index in range(spec.member_count))
    return FleetSummary(
        devices=spec.member_count, by_device=dict(by_device), fit=fits,
        by_status=dict(statuses), failures_by_code=dict(codes),
        final_loss=None if not losses else {"mean": mean(losses), "min": min(losses),
                                            "max": max(losses)})


def _member_kinds(spec: FleetSpec):
    """Member index -> its planned member, without its shard (a population's profile: no
    copy per phone)."""
    if spec.population is None:
        return spec.members.__getitem__
    return spec.population.profile_of


def round_public(current: FleetRound, fleet: Fleet, facts: dict[str, Facts]
                 ) -> FleetRoundPublic:
    host_wall_s = None if current.finished_at is None else \
        (current.finished_at - current.started_at).total_seconds()
    kinds = _member_kinds(fleet.spec)
    return FleetRoundPublic(
        index=current.index, status=current.status, eval_loss=current.eval_loss,
        simulated_wall_s=current.simulated_wall_s, host_wall_s=host_wall_s,
        started_at=current.started_at, finished_at=current.finished_at,
        participants=[RoundParticipant(**dict(seat), device=kinds(seat.member).device)
                      for seat in current.participants],
        summary=_round_summary(current, facts))


def _round_summary(current: FleetRound, facts: dict[str, Facts]) -> RoundSummary:
    seats = current.participants
    ran = [facts[seat.job_id] for seat in seats if seat.job_id in facts]
    losses = [row[3] for row in ran if row[1] in TERMINAL and row[3] is not None]
    peaks = [row[4] / MB for row in ran if row[4] is not None]
    times = [seat.device_time_s for seat in seats if seat.device_time_s is not None]
    outcomes = Counter(seat.outcome for seat in seats)
    return RoundSummary(cohort=len(seats), outcomes=dict(outcomes), final_loss=spread(losses),
                        measured_peak_mb=spread(peaks), device_time_s=spread(times))


def spread(values: list[float]) -> Spread | None:
    return None if not values else Spread(min=min(values), median=median(values),
                                          mean=mean(values), max=max(values))


def _references(session: Session, references: list[ReferenceRecord],
                jobs: dict[str, Job], rounds: list[FleetRound]) -> FleetReferences:
    runs = []
    for reference in references:
        job = jobs[reference.job_id]
        runs.append(ReferenceRun(**dict(reference), steps=job.total_steps, status=job.status,
                                 eval_loss=final_validation_loss(session, job)))
    local = [run for run in runs if run.kind == "local_only"]
    local_losses = [run.eval_loss for run in local if run.eval_loss is not None]
    ended = all(run.status in TERMINAL for run in local)
    central = [run.eval_loss for run in runs if run.kind == "centralized"]
    return FleetReferences(
        local_only_mean=mean(local_losses) if ended and local_losses else None,
        centralized=central[0] if central else None, runs=runs,
        schedule=_schedule(runs, rounds))


def _schedule(runs: list[ReferenceRun], rounds: list[FleetRound]) -> str:
    """When the reference runs train: they are claimed only when no job of a round waits
    (``service.federation.REFERENCE_PRIORITY``)."""
    ended = sum(run.status in TERMINAL for run in runs)
    running = sum(run.status == "running" for run in runs)
    if ended == len(runs):
        return "done"
    if running:
        return f"running ({running} running, {ended} of {len(runs)} done)"
    current = rounds[-1] if rounds else None
    if current is not None and current.status == "running":
        return f"queued behind round {current.index} ({ended} of {len(runs)} done)"
    return f"queued ({ended} of {len(runs)} done)"


def final_validation_loss(session: Session, job: Job) -> float | None:
    """A succeeded job's validation loss after its last step (none for any other job)."""
    if job.status != "succeeded":
        return None
    last = session.exec(select(Metric.data).where(Metric.job_id == job.id)
                        .order_by(Metric.step.desc())).first()
    return None if last is None else last.get("val_loss")


def _member(index: int, spec: FleetMemberSpec, job: Job | None, preparing: bool,
            in_population: bool) -> FleetMember:
    plan = spec.plan if job is None or not job.plan else job.plan  # what ran, once it did
    summary = plan if isinstance(plan, PlanSummary) else None  # none: recorded unplanned
    peak = None if job is None or job.peak_memory_bytes is None else \
        round(job.peak_memory_bytes / MB, 1)
    # a population's phone has its shard written when it first trains
    training_file = (None if job is None else job.training_file) if in_population else \
        spec.training_file
    return FleetMember(
        index=index, device=spec.device, shard=spec.shard, training_file=training_file,
        fits=spec.fits, budget_mb=plan.budget_mb,
        smallest_budget_mb=summary and summary.smallest_budget_mb,
        configuration=summary and summary.configuration,
        predicted_peak_mb=summary and summary.predicted_peak_mb, measured_peak_mb=peak,
        predicted_step_time_s=summary and summary.predicted_step_time_s,
        measured_step_time_s=None if job is None else job.step_time_s,
        device_step_time_s_estimate=plan.device_step_time_s_estimate,
        job_id=None if job is None else job.id, status=_status(spec, job, preparing),
        final_loss=None if job is None or job.status != "succeeded" else job.last_loss,
        error_code=None if job is None else job.error_code)


def _status(spec: FleetMemberSpec, job: Job | None, preparing: bool) -> str:
    if job is not None:
        return job.status
    return "preparing" if preparing and spec.job is not None else "not_run"
