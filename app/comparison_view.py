"""A comparison as the API and its page show it: each method's runs with their validation
curves in simulated phone time, the best learning rate per method, and the sentence."""

from __future__ import annotations

from sqlalchemy import or_
from sqlmodel import Session, col, select

from app.comparison_schemas import ComparisonPublic, ComparisonRun, CurvePoint, MethodOutcome
from app.comparison_sentence import TERMINAL, summarize
from app.job_schemas import JobError
from mebp_core.units import MB
from service.comparison_spec import MethodRecord
from service.models import Comparison, Job, Metric


def comparison_public(session: Session, comparison: Comparison) -> ComparisonPublic:
    jobs = session.exec(select(Job).where(Job.comparison_id == comparison.id)
                        .order_by(col(Job.created_at), col(Job.id))).all()
    runs = [run_of(session, job) for job in jobs]
    methods = [_outcome(record, [run for run in runs if run.method == record.method])
               for record in comparison.spec.methods]
    request = comparison.spec.request
    statuses = {run.status for run in runs}
    state = "done" if statuses <= TERMINAL else \
        "queued" if statuses <= {"queued", "validating"} else "running"
    return ComparisonPublic(
        id=comparison.id, status=state, model=comparison.model, device=comparison.device_id,
        memory_budget_mb=comparison.spec.budget_mb,
        training_file=request.training_file, validation_file=request.validation_file,
        max_steps=request.max_steps, max_device_time_s=request.max_device_time_s,
        summary=summarize(methods), methods=methods, metadata=request.metadata,
        created_at=comparison.created_at)


def run_of(session: Session, job: Job) -> ComparisonRun:
    config = job.train_config()
    planned = job.planned()
    estimate = None if job.plan is None else job.plan.device_step_time_s_estimate
    curve = validation_curve(session, job, config.eval_every or job.total_steps, estimate)
    losses = [point.val_loss for point in curve]
    finished = curve and curve[-1].step == job.total_steps
    return ComparisonRun(
        job_id=job.id, method=config.method, learning_rate=config.lr, status=job.status,
        error=None if job.error_code is None else JobError(
            code=job.error_code, message=job.error_message or "", detail=job.error_detail),
        step=job.step, total_steps=job.total_steps,
        predicted_peak_mb=None if planned is None else planned.predicted_peak_mb,
        measured_peak_mb=measured_peak_mb(job),
        device_step_time_s_estimate=estimate, best_val_loss=min(losses, default=None),
        final_val_loss=losses[-1] if finished else None, curve=curve)


def measured_peak_mb(job: Job) -> float | None:
    """The job's peak as its steps recorded it, else the kernel's figure for a job killed at
    its cap before it recorded a step."""
    if job.peak_memory_bytes is not None:
        return round(job.peak_memory_bytes / MB, 1)
    return (job.error_detail or {}).get("peak_mb")


def validation_curve(session: Session, job: Job, every: int,
                     estimate: float | None) -> list[CurvePoint]:
    """The job's validated steps (every ``every`` and its last): read from those rows only,
    never the whole history of a long job."""
    rows = session.exec(select(Metric.step, Metric.data, Metric.at).where(
        Metric.job_id == job.id,
        or_(col(Metric.step) % every == 0, col(Metric.step) == job.total_steps))
        .order_by(col(Metric.step))).all()
    return [CurvePoint(
        step=step, val_loss=data["val_loss"],
        device_time_s=None if estimate is None else round(estimate * step, 3),
        host_time_s=None if job.started_at is None
        else round(max(0.0, (at - job.started_at).total_seconds()), 3))
        for step, data, at in rows if data.get("val_loss") is not None]


def _outcome(record: MethodRecord, runs: list[ComparisonRun]) -> MethodOutcome:
    scored = [run for run in runs if run.best_val_loss is not None]
    best = min(scored, key=lambda run: (run.best_val_loss, run.learning_rate), default=None)
    peaks = [run.measured_peak_mb for run in runs if run.measured_peak_mb is not None]
    return MethodOutcome(
        **record.model_dump(exclude={"budget_mb"}), measured_peak_mb=max(peaks, default=None),
        best_learning_rate=None if best is None else best.learning_rate,
        best_job_id=None if best is None else best.job_id,
        best_val_loss=None if best is None else best.best_val_loss,
        best_curve=[] if best is None else best.curve, runs=runs)
