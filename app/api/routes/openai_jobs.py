"""``/v1/fine_tuning/jobs``: OpenAI's fine-tuning jobs over mebp's jobs, submitted, read and
cancelled by the same code as ``/v1/jobs``. A job's checkpoints are ``/v1/jobs/{id}/checkpoints``':
the adapters it kept every ``checkpoint_every`` steps; the engine's
resumable state inside a running job is no model, and is not listed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.events import MAX_ID
from app.api.openai_errors import OpenAIRoute
from app.api.paging import IdCursor, ListLimit, newest_first
from app.api.routes.checkpoints import checkpoints_page
from app.api.routes.jobs import cancel_or_409, get_job_or_404
from app.api.url_guard import check_webhook_url
from app.openai_schemas import (
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobCreate,
    FineTuningJobEvent,
    OpenAIList,
)
from app.openai_view import fine_tuning_job, job_checkpoint, job_event
from app.submit import submit_job
from service.crud import events_page, latest_adapter
from service.models import Job

router = APIRouter(prefix="/fine_tuning/jobs", tags=["fine-tuning (OpenAI)"],
                   route_class=OpenAIRoute)


@router.post("", response_model=FineTuningJob)
def create_fine_tuning_job(body: FineTuningJobCreate, request: Request, session: SessionDep,
                           settings: SettingsDep, principal: PrincipalDep) -> FineTuningJob:
    """``POST /v1/jobs``'s body and checks, with OpenAI's ``method`` object accepted."""
    check_webhook_url(body.webhook_url, request, settings)
    job = submit_job(session, body.job_create(), settings, request.app.state.enqueue,
                     tenant=principal.tenant, redis=request.app.state.redis)
    return fine_tuning_job(job, None)


@router.get("", response_model=OpenAIList[FineTuningJob])
def list_fine_tuning_jobs(session: SessionDep, principal: PrincipalDep,
                          after: IdCursor = None,
                          limit: ListLimit = 20) -> OpenAIList[FineTuningJob]:
    """Newest first."""
    jobs, more = newest_first(session, Job, tenant=principal.tenant, after=after, limit=limit)
    return OpenAIList[FineTuningJob](
        data=[fine_tuning_job(job, latest_adapter(session, job.id)) for job in jobs],
        has_more=more)


@router.get("/{job_id}", response_model=FineTuningJob)
def read_fine_tuning_job(job_id: str, session: SessionDep,
                         principal: PrincipalDep) -> FineTuningJob:
    job = get_job_or_404(session, job_id, principal)
    return fine_tuning_job(job, latest_adapter(session, job.id))


@router.post("/{job_id}/cancel", response_model=FineTuningJob)
def cancel_fine_tuning_job(job_id: str, session: SessionDep,
                           principal: PrincipalDep) -> FineTuningJob:
    """As ``POST /v1/jobs/{id}/cancel``: a running job stops after its current step."""
    job = cancel_or_409(session, get_job_or_404(session, job_id, principal))
    return fine_tuning_job(job, latest_adapter(session, job.id))


@router.get("/{job_id}/events", response_model=OpenAIList[FineTuningJobEvent])
def list_fine_tuning_events(
        job_id: str, session: SessionDep, principal: PrincipalDep,
        after: Annotated[int | None, Query(ge=0, le=MAX_ID, description=(
            "the last event id of the page before; unset, from the newest"))] = None,
        limit: ListLimit = 20) -> OpenAIList[FineTuningJobEvent]:
    """The job's events (as ``GET /v1/jobs/{id}/events``), newest first."""
    get_job_or_404(session, job_id, principal)
    events = events_page(session, job_id, after_id=after, limit=limit + 1, newest_first=True)
    return OpenAIList[FineTuningJobEvent](data=[job_event(e) for e in events[:limit]],
                                          has_more=len(events) > limit)


@router.get("/{job_id}/checkpoints", response_model=OpenAIList[FineTuningJobCheckpoint])
def list_fine_tuning_checkpoints(job_id: str, session: SessionDep, principal: PrincipalDep,
                                 after: IdCursor = None,
                                 limit: ListLimit = 10) -> OpenAIList[FineTuningJobCheckpoint]:
    """The adapters the job kept at its checkpoint steps, newest first."""
    job = get_job_or_404(session, job_id, principal)
    rows, more = checkpoints_page(session, job.id, after=after, limit=limit)
    return OpenAIList[FineTuningJobCheckpoint](data=[job_checkpoint(row) for row in rows],
                                               has_more=more)
