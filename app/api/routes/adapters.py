"""``GET /v1/jobs/{id}/adapter``: the adapter a job trained, as a PEFT zip or exported."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import FileResponse, Response
from sqlmodel import Session
from starlette.background import BackgroundTask

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.routes.jobs import get_job_or_404
from service.adapter_downloads import AdapterFormat, AdapterGoneError, open_adapter_file
from service.crud import latest_adapter
from service.settings import Settings
from service.storage import base_config_path

router = APIRouter(prefix="/jobs", tags=["jobs"])
FormatQuery = Query("peft", description="peft and mlx come zipped; gguf is one file")
DOWNLOAD_RESPONSES = {200: {"content": {"application/zip": {}, "application/octet-stream": {}},
                            "headers": {"X-Adapter-SHA256": {
                                "description": "sha256 of the exact bytes served"}}}}


@router.get("/{job_id}/adapter", response_class=Response, responses=DOWNLOAD_RESPONSES)
def download_adapter(job_id: str, session: SessionDep, settings: SettingsDep,
                     principal: PrincipalDep,
                     format: AdapterFormat = FormatQuery) -> Response:
    job = get_job_or_404(session, job_id, principal)
    adapter = latest_adapter(session, job.id)
    if adapter is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"job {job_id} has no adapter (status {job.status})")
    return adapter_download(session, Path(adapter.path), format,
                            base_config(settings, job.id), job_id,
                            gone=f"job {job_id}'s adapter is no longer stored")


def base_config(settings: Settings, job_id: str) -> dict:
    """The job's base model's Hugging Face config, kept beside its adapters for exports."""
    return json.loads(base_config_path(settings.storage_root, job_id).read_text())


def adapter_download(session: Session, source: Path, format: AdapterFormat,
                     base_config: dict, stem: str, *, gone: str) -> FileResponse:
    """The PEFT adapter at ``source`` as ``format`` (peft and mlx zipped, gguf one file),
    streamed from the file kept beside it, made by the first download if need be; a 404
    saying ``gone`` if the adapter is no longer there (a checkpoint pruned meanwhile). The
    request's session is closed first: a yield dependency ends only once the response is
    sent, and neither the making nor a slow client's download may hold a database slot."""
    session.close()
    try:
        kept, file = open_adapter_file(source, format, base_config)
    except AdapterGoneError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, gone) from None
    # served from the file held open, through /proc/self/fd: whole even if pruned meanwhile
    descriptor = file.fileno()
    return FileResponse(f"/proc/self/fd/{descriptor}", stat_result=os.fstat(descriptor),
                        media_type=kept.media_type, filename=kept.download_name(stem),
                        headers={"X-Adapter-SHA256": kept.sha256},
                        background=BackgroundTask(file.close))
