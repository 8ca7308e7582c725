"""Small reads and writes of the service's tables, shared by the API and the workers."""

from __future__ import annotations

from sqlmodel import Session, select

from app.models import Adapter, Event, Job, Metric, utc_now
from app.schemas import JobError, JobProgress, JobPublic
from mebp_core.units import MB

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def add_event(session: Session, *, job_id: str, kind: str, message: str,
              data: dict | None = None) -> Event:
    event = Event(job_id=job_id, kind=kind, message=message, data=data or {})
    session.add(event)
    return event


def set_status(session: Session, job: Job, status: str, message: str, *,
               data: dict | None = None) -> None:
    """Move ``job`` to ``status`` (its finish time if terminal) with an event; the caller
    commits. Running is not set here: workers claim jobs atomically (``worker.lease``)."""
    job.status = status
    if status in TERMINAL:
        job.finished_at = utc_now()
    session.add(job)
    add_event(session, job_id=job.id, kind="status", message=message,
              data={"status": status, **(data or {})})


def fail_job(session: Session, job: Job, code: str, message: str,
             detail: dict | None = None) -> None:
    job.error_code, job.error_message, job.error_detail = code, message, detail
    set_status(session, job, "failed", f"failed: {message}", data={"code": code})


def latest_adapter(session: Session, job_id: str) -> Adapter | None:
    return session.exec(select(Adapter).where(Adapter.job_id == job_id)
                        .order_by(Adapter.created_at.desc())).first()


def events_after(session: Session, job_id: str, after_id: int) -> list[Event]:
    return list(session.exec(select(Event).where(Event.job_id == job_id, Event.id > after_id)
                             .order_by(Event.id)).all())


def metrics_after(session: Session, job_id: str, after_id: int) -> list[Metric]:
    return list(session.exec(select(Metric).where(Metric.job_id == job_id,
                                                  Metric.id > after_id)
                             .order_by(Metric.id)).all())


def job_public(job: Job, adapter: Adapter | None) -> JobPublic:
    error = None if job.error_code is None else JobError(
        code=job.error_code, message=job.error_message or "", detail=job.error_detail)
    return JobPublic(
        id=job.id, status=job.status, model=job.model, device=job.device_id,
        memory_budget_mb=_mb(job.memory_budget_bytes), method=job.train_config().method,
        config=job.config, plan=job.plan, training_file=job.training_file,
        validation_file=job.validation_file, fleet_id=job.fleet_id,
        enforcement=job.enforcement, attempts=job.attempts, worker=job.worker,
        progress=JobProgress(step=job.step, total_steps=job.total_steps, loss=job.last_loss,
                             peak_memory_mb=_mb(job.peak_memory_bytes),
                             peak_anon_mb=_mb(job.peak_anon_bytes),
                             cgroup_peak_usage_mb=_mb(job.cgroup_peak_bytes),
                             step_time_s=job.step_time_s,
                             predicted_peak_mb=(job.plan or {}).get("predicted_peak_mb"),
                             predicted_step_time_s=(job.plan or {})
                             .get("predicted_step_time_s")),
        error=error,
        adapter=None if adapter is None else {
            "id": adapter.id, "sha256": adapter.sha256, "bytes": adapter.bytes,
            "formats": ["peft", "mlx", "gguf"]},
        metadata=job.metadata_, created_at=job.created_at, started_at=job.started_at,
        finished_at=job.finished_at)


def _mb(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / MB, 1)

