"""Submitting jobs: checking what a request refers to, planning it, writing its rows, and
only then enqueueing its id (the worker must find the row it is sent)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from fastapi import HTTPException, status
from redis import Redis
from sqlalchemy import case, func, text
from sqlmodel import Session, col, select

from app.api.errors import invalid
from app.api.model_lookup import model_architecture_or_422
from app.job_schemas import JobCreate
from app.planning import PlannedJob, plan_job
from mebp_core.plan.arch import Architecture
from service.crud import create_queued_job
from service.models import Dataset, Fleet, Job
from service.settings import Settings


def check_references(session: Session, body: JobCreate, tenant: str) -> Architecture:
    """422 unless the datasets exist and the model is one the service can run; the model's
    architecture, resolved once for the request's plans."""
    for field in ("training_file", "validation_file"):
        dataset_id = getattr(body, field)
        dataset = None if dataset_id is None else session.get(Dataset, dataset_id)
        if dataset_id is not None and (dataset is None or dataset.tenant != tenant):
            raise invalid(field, "no such dataset (upload it with POST /v1/datasets or "
                          "/v1/files)",
                          dataset_id)
    return model_architecture_or_422(session, body.model)


def require_queue(redis: Redis) -> None:
    """A job is accepted only while Redis answers (else a 503 before anything is written):
    one accepted while the queue is down would wait for the reconciler."""
    redis.ping()


QUEUE_FULL_RETRY_S = 30  # a guess: the queue drains as the tenant's jobs start
QUEUED = ("validating", "queued")


def queued_jobs(session: Session, tenant: str) -> int:
    """The tenant's queued jobs, and the seats its fleets hold for jobs they have yet to
    queue (a preparing fleet's, a federated fleet's later rounds) less those fleets' jobs
    queued now: in one statement, so one snapshot sees a round's jobs take their seats."""
    fleet_queued = select(func.count()).select_from(Job).where(
        Job.fleet_id == Fleet.id, col(Job.status).in_(QUEUED)).correlate(Fleet)
    unused = Fleet.reserved_jobs - fleet_queued.scalar_subquery()
    held = select(func.coalesce(func.sum(case((unused > 0, unused), else_=0)), 0)).where(
        Fleet.tenant == tenant, Fleet.reserved_jobs > 0)
    queued = select(func.count()).select_from(Job).where(Job.tenant == tenant,
                                                         col(Job.status).in_(QUEUED))
    return session.exec(select(queued.scalar_subquery() + held.scalar_subquery())).one()


def require_queue_room(session: Session, settings: Settings, *, tenant: str,
                       adding: int = 1) -> None:
    """429 unless the tenant's queued jobs (``queued_jobs``) plus ``adding`` stay within
    ``max_queued_jobs_per_tenant``: checked early (before planning or writing), and again
    with ``adding=0`` once the new rows are in, under ``lock_queue``, which makes it exact."""
    queued = queued_jobs(session, tenant)
    limit = settings.max_queued_jobs_per_tenant
    if queued + adding > limit:
        more = "another job" if adding == 1 else f"{adding} more jobs"
        advice = "retry once some have started" if adding <= limit else "make fewer at once"
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                            f"tenant {tenant!r} has {queued} jobs queued (or held for its "
                            f"fleets' later rounds); {more} would pass its limit of {limit} "
                            f"(MEBP_MAX_QUEUED_JOBS_PER_TENANT): {advice}",
                            headers={"Retry-After": str(QUEUE_FULL_RETRY_S)})


def lock_queue(session: Session, tenant: str) -> None:
    """Submissions of one tenant take turns from here to their commit, so the count after
    their insert sees every other one. PostgreSQL: a transaction-scoped advisory lock;
    SQLite runs one writer at a time already (the insert waits for the other's commit)."""
    if session.get_bind().dialect.name == "postgresql":
        session.connection().execute(text("select pg_advisory_xact_lock(hashtext(:key))"),
                                     {"key": f"mebp-queue:{tenant}"})


def body_sha256(body: JobCreate) -> str:
    """The fingerprint an ``Idempotency-Key`` is bound to: the sha256 of the validated body as
    canonical JSON, so key order, spacing and defaults written out or left out do not make two
    requests differ (the raw bytes would), while any value that changes the job does."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def insert_job(session: Session, body: JobCreate, planned: PlannedJob, *, tenant: str,
               fleet_id: str | None = None, comparison_id: str | None = None,
               idempotency_key: str | None = None) -> Job:
    return create_queued_job(
        session, plan=planned.plan, tenant=tenant, model=body.model,
        device_id=None if planned.device is None else planned.device.id,
        memory_budget_bytes=planned.budget_bytes, config=planned.config,
        training_file=body.training_file, validation_file=body.validation_file,
        fleet_id=fleet_id, comparison_id=comparison_id, metadata_=body.metadata,
        webhook_url=None if body.webhook_url is None else str(body.webhook_url),
        idempotency_key=idempotency_key,
        request_sha256=None if idempotency_key is None else body_sha256(body))


def submit_job(session: Session, body: JobCreate, settings: Settings,
               enqueue: Callable[[str], None], *, tenant: str, redis: Redis,
               idempotency_key: str | None = None) -> Job:
    """Plan ``body`` and queue it; a 422 (``RequestValidationError``) when a field is wrong or
    the budget is predicted too small without ``allow_infeasible``, a 429 when the tenant's
    queue is full."""
    arch = check_references(session, body, tenant)
    require_queue(redis)
    require_queue_room(session, settings, tenant=tenant)
    planned = plan_job(body, arch, settings, session)
    if not planned.feasible and not body.allow_infeasible:
        raise planned.infeasible_error()
    lock_queue(session, tenant)
    job = insert_job(session, body, planned, tenant=tenant, idempotency_key=idempotency_key)
    require_queue_room(session, settings, tenant=tenant, adding=0)  # exact, under the lock
    session.commit()
    enqueue(job.id)
    session.refresh(job)
    return job
