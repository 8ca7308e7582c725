"""``/v1/jobs``: submit a fine-tuning job for a device profile, follow it, cancel it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select
from starlette.concurrency import run_in_threadpool

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.events import open_event_stream
from app.api.paging import DEFAULT_ROWS, Limit, after_query, page_of
from app.api.url_guard import check_webhook_url
from app.common_schemas import ErrorMessage
from app.job_schemas import (
    EventPublic,
    JobCreate,
    JobPublic,
    JobsPublic,
    JobStatus,
    MetricPublic,
    MetricsPublic,
)
from app.job_view import job_public
from app.keys import Principal
from app.submit import body_sha256, submit_job
from service.crud import (
    TERMINAL,
    events_page,
    latest_adapter,
    metrics_page,
    request_cancel,
)
from service.models import Job

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.post("", response_model=JobPublic, status_code=status.HTTP_201_CREATED,
             responses={200: {"description": "a repeat of an Idempotency-Key: the same job"},
                        409: {"model": ErrorMessage, "description": "the Idempotency-Key was "
                              "used for a different request body"},
                        422: {"description": "invalid field, or a budget too small "
                                             "(the error carries smallest_budget_mb)"}})
def create_job(body: JobCreate, request: Request, response: Response, session: SessionDep,
               settings: SettingsDep, principal: PrincipalDep,
               idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128)]
               = None) -> JobPublic:
    """``Idempotency-Key``: a repeat with the same key and body answers the job the first one
    made; the same key with another body is a 409."""
    check_webhook_url(body.webhook_url, request, settings)
    if idempotency_key is not None:
        existing = find_by_idempotency_key(session, principal.tenant, idempotency_key, body)
        if existing is not None:
            response.status_code = status.HTTP_200_OK
            return job_public(existing, latest_adapter(session, existing.id))
    try:
        job = submit_job(session, body, settings, request.app.state.enqueue,
                         tenant=principal.tenant, redis=request.app.state.redis,
                         idempotency_key=idempotency_key)
    except IntegrityError:  # the same key, submitted concurrently: the other one won
        session.rollback()
        if idempotency_key is None:
            raise
        job = find_by_idempotency_key(session, principal.tenant, idempotency_key, body)
        if job is None:
            raise
        response.status_code = status.HTTP_200_OK
    return job_public(job, latest_adapter(session, job.id))


def find_by_idempotency_key(session, tenant: str, key: str, body: JobCreate) -> Job | None:
    """The job a request with ``key`` made, if any; a 409 if that request's body was not
    ``body`` (a job made before bodies were fingerprinted is taken as the same)."""
    job = session.exec(select(Job).where(Job.tenant == tenant,
                                         Job.idempotency_key == key)).first()
    if job is not None and job.request_sha256 not in (None, body_sha256(body)):
        raise HTTPException(status.HTTP_409_CONFLICT, f"Idempotency-Key {key!r} was used for "
                            "a different request body; use a new key")
    return job


@router.get("", response_model=JobsPublic)
def list_jobs(session: SessionDep, principal: PrincipalDep,
              status_: Annotated[JobStatus | None, Query(alias="status")] = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JobsPublic:
    query = (select(Job).where(Job.tenant == principal.tenant)
             .order_by(Job.created_at.desc()).limit(limit))
    if status_ is not None:
        query = query.where(Job.status == status_)
    jobs = session.exec(query).all()
    return JobsPublic(data=[job_public(job, latest_adapter(session, job.id)) for job in jobs],
                      count=len(jobs))


@router.get("/{job_id}", response_model=JobPublic)
def read_job(job_id: str, session: SessionDep, principal: PrincipalDep) -> JobPublic:
    job = get_job_or_404(session, job_id, principal)
    return job_public(job, latest_adapter(session, job.id))


@router.post("/{job_id}/cancel", response_model=JobPublic)
def cancel_job(job_id: str, session: SessionDep, principal: PrincipalDep) -> JobPublic:
    """A queued job is cancelled at once; a running one stops after its current step and
    keeps the adapter trained so far."""
    job = cancel_or_409(session, get_job_or_404(session, job_id, principal))
    return job_public(job, latest_adapter(session, job.id))


def cancel_or_409(session: Session, job: Job) -> Job:
    """``job``, cancelled or asked to stop (``request_cancel``); a 409 once it has ended."""
    if job.status in TERMINAL:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job.id} is already {job.status}")
    request_cancel(session, job.id)
    session.commit()
    session.refresh(job)
    return job


@router.get("/{job_id}/events", response_model=list[EventPublic],
            responses={200: {"content": {"text/event-stream": {}},
                             "headers": {"Link": {"description": "the next page, if any: "
                                                  '<url>; rel="next"'}}},
                       429: {"model": ErrorMessage, "description": "this key has "
                             "MEBP_MAX_STREAMS_PER_KEY event streams open already"}})
async def read_events(job_id: str, request: Request, response: Response, session: SessionDep,
                      principal: PrincipalDep, after: int | None = after_query("event id"),
                      limit: Limit = DEFAULT_ROWS):
    """A page of the job's events in id order; with ``Accept: text/event-stream``, a live
    stream of events and per-step metrics that ends when the job does (``Last-Event-ID``
    resumes; ``after`` and ``limit`` do not apply)."""
    # the key is checked: give its connection back at once, so that no request waits for a
    # thread while holding one (a burst of streams emptied the pool) and no stream holds one
    session.close()
    state = request.app.state
    streaming = "text/event-stream" in request.headers.get("accept", "")
    async with state.session_slots.hold():
        events = await run_in_threadpool(_job_events, state.engine, job_id, principal,
                                         after=after, limit=0 if streaming else limit + 1)
    if not streaming:
        return page_of(events, limit, request, response, lambda event: event.id)[0]
    return open_event_stream(state, job_id, principal.key_hash,
                             request.headers.get("last-event-id"))


def _job_events(engine, job_id: str, principal: Principal, *, after: int | None,
                limit: int) -> list[EventPublic]:
    """A 404 unless the job is the principal's; at most ``limit`` of its events after
    ``after``."""
    with Session(engine) as session:
        get_job_or_404(session, job_id, principal)
        return [EventPublic.model_validate(event) for event in events_page(
            session, job_id, after_id=after, limit=limit)] if limit else []


@router.get("/{job_id}/metrics", response_model=MetricsPublic, responses={200: {"headers": {
    "Link": {"description": 'the next page, if any: <url>; rel="next"'}}}})
def read_metrics(job_id: str, request: Request, response: Response, session: SessionDep,
                 principal: PrincipalDep, after: int | None = after_query("step"),
                 limit: Limit = DEFAULT_ROWS) -> MetricsPublic:
    """A page of the job's per-step metrics, in step order."""
    get_job_or_404(session, job_id, principal)
    rows, next_url = page_of(metrics_page(session, job_id, after_step=after, limit=limit + 1),
                             limit, request, response, lambda metric: metric.step)
    return MetricsPublic(data=[MetricPublic(step=m.step, loss=m.loss, data=m.data, at=m.at)
                               for m in rows], count=len(rows), next=next_url)


def get_job_or_404(session, job_id: str, principal: Principal) -> Job:
    """Another tenant's job is as unknown as a job that never was."""
    job = session.get(Job, job_id)
    if job is None or job.tenant != principal.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
    return job
