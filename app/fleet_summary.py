"""A fleet as the API shows it: each device's plan and job, and what the fleet came to."""

from __future__ import annotations

from collections import Counter
from statistics import mean

from sqlmodel import Session, select

from app.fleet_schemas import (
    FleetMember,
    FleetPublic,
    FleetReferences,
    FleetRoundPublic,
    FleetSummary,
    ReferenceRun,
    RoundParticipant,
)
from mebp_core.plan.summary import PlanSummary
from mebp_core.units import MB
from service.crud import TERMINAL
from service.federation import rounds_of
from service.fleet_shards import PREPARING
from service.fleet_spec import FleetMemberSpec, ReferenceRecord
from service.models import Fleet, FleetRound, Job, Metric


def fleet_public(session: Session, fleet: Fleet) -> FleetPublic:
    jobs = {job.id: job for job in session.exec(select(Job).where(Job.fleet_id == fleet.id))}
    rounds = rounds_of(session, fleet.id)
    latest = {seat.member: seat.job_id for r in rounds for seat in r.participants
              if seat.job_id is not None}  # a federated device's latest round's job
    preparing = fleet.status == PREPARING
    members = [_member(spec, jobs.get(spec.job_id or latest.get(index)), preparing)
               for index, spec in enumerate(fleet.spec.members)]
    losses = [m.final_loss for m in members if m.status == "succeeded" and m.final_loss]
    summary = FleetSummary(
        devices=len(members), fit=sum(m.fits for m in members),
        by_status=dict(Counter(m.status for m in members)),
        failures_by_code=dict(Counter(m.error_code for m in members if m.error_code)),
        final_loss=None if not losses else {"mean": mean(losses), "min": min(losses),
                                            "max": max(losses)})
    request = fleet.spec.request
    return FleetPublic(id=fleet.id, model=fleet.model, method=request.method,
                       aggregation=request.aggregation,
                       planned_rounds=request.rounds if request.federated else None,
                       local_steps=request.steps_per_round if request.federated else None,
                       created_at=fleet.created_at, status=fleet.status, error=fleet.error,
                       members=members, summary=summary,
                       rounds=[_round(r, fleet.spec.members) for r in rounds],
                       references=_references(session, fleet.spec.references, jobs, rounds),
                       metadata=request.metadata)


def _round(current: FleetRound, members: list[FleetMemberSpec]) -> FleetRoundPublic:
    host_wall_s = None if current.finished_at is None else \
        (current.finished_at - current.started_at).total_seconds()
    return FleetRoundPublic(
        index=current.index, status=current.status, eval_loss=current.eval_loss,
        simulated_wall_s=current.simulated_wall_s, host_wall_s=host_wall_s,
        started_at=current.started_at, finished_at=current.finished_at,
        participants=[RoundParticipant(**dict(seat), device=members[seat.member].device)
                      for seat in current.participants])


def _references(session: Session, references: list[ReferenceRecord] | None,
                jobs: dict[str, Job], rounds: list[FleetRound]) -> FleetReferences | None:
    if references is None:
        return None
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


def _member(spec: FleetMemberSpec, job: Job | None, preparing: bool) -> FleetMember:
    plan = spec.plan if job is None or not job.plan else job.plan  # what ran, once it did
    summary = plan if isinstance(plan, PlanSummary) else None  # none: recorded unplanned
    peak = None if job is None or job.peak_memory_bytes is None else \
        round(job.peak_memory_bytes / MB, 1)
    return FleetMember(
        device=spec.device, shard=spec.shard, training_file=spec.training_file,
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
