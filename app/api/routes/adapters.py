"""``GET /v1/jobs/{id}/adapter``: the adapter a job trained, as a PEFT zip or exported."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import FileResponse, Response
from sqlmodel import Session

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.routes.jobs import get_job_or_404
from service.adapter_downloads import AdapterFormat, adapter_file
from service.crud import latest_adapter
from service.storage import base_config_path

router = APIRouter(prefix="/jobs", tags=["jobs"])
FormatQuery = Query("peft", description="peft and mlx come zipped; gguf is one file")


@router.get("/{job_id}/adapter", response_class=Response,
            responses={200: {"content": {"application/zip": {}, "application/octet-stream": {}},
                             "headers": {"X-Adapter-SHA256": {
                                 "description": "sha256 of the exact bytes served"}}}})
def download_adapter(job_id: str, session: SessionDep, settings: SettingsDep,
                     principal: PrincipalDep,
                     format: AdapterFormat = FormatQuery) -> Response:
    job = get_job_or_404(session, job_id, principal)
    adapter = latest_adapter(session, job.id)
    if adapter is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"job {job_id} has no adapter (status {job.status})")
    base_config = json.loads(base_config_path(settings.storage_root, job.id).read_text())
    return adapter_download(session, Path(adapter.path), format, base_config, job_id)


def adapter_download(session: Session, source: Path, format: AdapterFormat,
                     base_config: dict, stem: str) -> FileResponse:
    """The PEFT adapter at ``source`` as ``format`` (peft and mlx zipped, gguf one file),
    streamed from the file kept beside it, made by the first download if need be. The
    request's session is closed first: a yield dependency ends only once the response is
    sent, and neither the making nor a slow client's download may hold a database slot."""
    session.close()
    kept = adapter_file(source, format, base_config)
    return FileResponse(kept.path, media_type=kept.media_type,
                        filename=kept.download_name(stem),
                        headers={"X-Adapter-SHA256": kept.sha256})
