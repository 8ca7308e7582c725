"""Small reads and writes of the service's tables, shared by the API and the workers: a job's
status moves, its events, metrics and adapter."""

from __future__ import annotations

from sqlmodel import Session, col, select, update

from mebp_core.config import TrainConfig
from mebp_core.plan.summary import PlanSummary
from service.job_plan import UnplannedJob, load_plan
from service.models import Adapter, Event, Job, Metric, utc_now
from service.storage import new_id
from service.webhooks import add_job_event_delivery

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def add_event(session: Session, *, job_id: str, kind: str, message: str,
              data: dict | None = None) -> Event:
    """The job's event, and its webhook delivery if it posts one (``service.webhooks``);
    the caller commits both at once."""
    event = Event(job_id=job_id, kind=kind, message=message, data=data or {})
    session.add(event)
    add_job_event_delivery(session, job_id=job_id, kind=kind, message=message,
                           data=event.data)
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


def create_queued_job(session: Session, *, plan: PlanSummary, config: TrainConfig,
                      **fields) -> Job:
    """A new job row with its first events, queued; the caller commits, then enqueues.
    ``fields`` are the Job's (tenant, model, training_file, ...)."""
    return create_queued_jobs(session, [{"plan": plan, "config": config, **fields}])[0]


def create_queued_jobs(session: Session, rows: list[dict], **common) -> list[Job]:
    """``create_queued_job`` for each of ``rows`` (with the fields in ``common``; a row may
    bring its own ``id``): every row built before anything is written, then written in two
    flushes, so a fleet's hundreds of jobs keep its transaction short. A row's config and
    plan may be the models, or their JSON (a fleet's job template): validated here."""
    jobs = [_queued_job(row, common) for row in rows]
    events = [Event(job_id=job.id, kind="status", message=message, data=data) for job in jobs
              for message, data in (("validated and planned",
                                     {"status": "validating", "plan": _json(job.plan)}),
                                    ("queued", {"status": "queued"}))]
    session.flush()  # what the jobs refer to (a fleet, its shards) goes first
    session.add_all(jobs)
    session.flush()  # then the rows the events refer to
    session.add_all(events)
    return jobs


def _queued_job(row: dict, common: dict) -> Job:
    config = TrainConfig.model_validate(row["config"])  # a TrainConfig passes as it is
    return Job(**{"id": new_id("job"), **row, "config": config.model_dump(mode="json"),
                  "plan": load_plan(row["plan"])},
               status="queued", total_steps=config.steps, **common)


def _json(plan: PlanSummary | UnplannedJob | None) -> dict | None:
    return None if plan is None else plan.model_dump(mode="json")


def request_cancel(session: Session, job_id: str) -> None:
    """A queued job is cancelled at once; a running one is asked to stop after its current
    step, keeping the adapter trained so far. The caller commits."""
    # only while no worker holds it; a worker may claim it between a read and this write
    dropped = session.exec(update(Job).where(Job.id == job_id,
                                             col(Job.status).in_(("validating", "queued")))
                           .values(status="cancelled", finished_at=utc_now()))
    if dropped.rowcount == 1:
        add_event(session, job_id=job_id, kind="status", message="cancelled before it ran",
                  data={"status": "cancelled"})
    else:  # running: the worker stops it after the current step, keeping the adapter
        session.exec(update(Job).where(Job.id == job_id).values(cancel_requested=True))
        add_event(session, job_id=job_id, kind="cancel", message="cancel requested")


def fail_job(session: Session, job: Job, code: str, message: str,
             detail: dict | None = None) -> None:
    job.error_code, job.error_message, job.error_detail = code, message, detail
    set_status(session, job, "failed", f"failed: {message}", data={"code": code})


def latest_adapter(session: Session, job_id: str) -> Adapter | None:
    return session.exec(select(Adapter).where(Adapter.job_id == job_id)
                        .order_by(Adapter.created_at.desc())).first()


def events_page(session: Session, job_id: str, *, after_id: int | None, limit: int,
                newest_first: bool = False) -> list[Event]:
    """The job's events after the one ``after_id`` (from the first if None), in id order,
    at most ``limit``; ``newest_first``: in reverse, so after means older."""
    query = select(Event).where(Event.job_id == job_id)
    if after_id is not None:
        query = query.where(col(Event.id) < after_id if newest_first
                            else col(Event.id) > after_id)
    order = col(Event.id).desc() if newest_first else col(Event.id)
    return list(session.exec(query.order_by(order).limit(limit)).all())


def metrics_page(session: Session, job_id: str, *, after_step: int | None,
                 limit: int) -> list[Metric]:
    """The job's metrics after step ``after_step`` (from the first if None), in step order,
    at most ``limit``."""
    query = select(Metric).where(Metric.job_id == job_id)
    if after_step is not None:
        query = query.where(col(Metric.step) > after_step)
    return list(session.exec(query.order_by(col(Metric.step)).limit(limit)).all())
