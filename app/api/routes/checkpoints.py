"""``/v1/jobs/{id}/checkpoints``: the adapters a job kept at its checkpoint steps, newest
first, each downloaded as the job's final adapter is (``adapters.adapter_download``)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import Response
from sqlmodel import Session, col, select

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.api.paging import IdCursor, ListLimit
from app.api.routes.adapters import DOWNLOAD_RESPONSES, FormatQuery, adapter_download, base_config
from app.api.routes.jobs import get_job_or_404
from app.checkpoint_schemas import CheckpointsPublic, checkpoint_public
from service.adapter_downloads import AdapterFormat
from service.job_checkpoints import checkpoint_step
from service.models import JobCheckpoint

router = APIRouter(prefix="/jobs", tags=["jobs"])


def checkpoints_page(session: Session, job_id: str, *, after: str | None,
                     limit: int) -> tuple[list[JobCheckpoint], bool]:
    """The job's checkpoints, newest first, after the one ``after`` (its step read from its
    id: pruned since, it still pages on; a 422 if it is no id of the job's); and whether
    more follow."""
    query = select(JobCheckpoint).where(JobCheckpoint.job_id == job_id)
    if after is not None:
        step = checkpoint_step(job_id, after)
        if step is None:
            raise invalid("after", "no checkpoint id of this job", after, where="query")
        query = query.where(JobCheckpoint.step < step)
    rows = list(session.exec(query.order_by(col(JobCheckpoint.step).desc())
                             .limit(limit + 1)).all())
    return rows[:limit], len(rows) > limit


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPublic)
def list_checkpoints(job_id: str, session: SessionDep, principal: PrincipalDep,
                     after: IdCursor = None, limit: ListLimit = 20) -> CheckpointsPublic:
    """Kept every ``checkpoint_every`` steps (a fleet's phone keeps none), the newest
    ``MEBP_MAX_CHECKPOINTS_PER_JOB`` of them."""
    get_job_or_404(session, job_id, principal)
    rows, more = checkpoints_page(session, job_id, after=after, limit=limit)
    return CheckpointsPublic(data=[checkpoint_public(row) for row in rows], has_more=more)


@router.get("/{job_id}/checkpoints/{checkpoint_id}/adapter", response_class=Response,
            responses=DOWNLOAD_RESPONSES)
def download_checkpoint(job_id: str, checkpoint_id: str, session: SessionDep,
                        settings: SettingsDep, principal: PrincipalDep,
                        format: AdapterFormat = FormatQuery) -> Response:
    """The checkpoint's adapter, in any format the job's adapter downloads as."""
    job = get_job_or_404(session, job_id, principal)
    checkpoint = session.get(JobCheckpoint, checkpoint_id)
    if checkpoint is None or checkpoint.job_id != job.id:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"job {job_id} has no checkpoint {checkpoint_id!r}")
    return adapter_download(
        session, Path(checkpoint.path), format, base_config(settings, job.id), checkpoint.id,
        gone=f"checkpoint {checkpoint.id} of job {job_id} was pruned: the newest "
             f"{settings.max_checkpoints_per_job} are kept (MEBP_MAX_CHECKPOINTS_PER_JOB)")
