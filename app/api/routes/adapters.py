"""``GET /v1/jobs/{id}/adapter``: the adapter a job trained, as a PEFT zip or exported."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import Response

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.routes.jobs import get_job_or_404
from mebp_core.lora.export import export_adapter
from service.crud import latest_adapter
from service.storage import base_config_path, zip_bytes

router = APIRouter(prefix="/jobs", tags=["jobs"])
AdapterFormat = Literal["peft", "mlx", "gguf"]
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
    return adapter_download(Path(adapter.path), format, base_config, job_id)


def adapter_download(source: Path, format: AdapterFormat, base_config: dict,
                     stem: str) -> Response:
    """The PEFT adapter at ``source`` as ``format``: peft and mlx zipped, gguf one file."""
    if format == "peft":
        return _zip_response(source, f"{stem}-peft.zip")
    with tempfile.TemporaryDirectory() as tmp:
        out = export_adapter(source, format, Path(tmp) / format, base_config=base_config)
        if format == "gguf":
            return _download(out.read_bytes(), "application/octet-stream", f"{stem}.gguf")
        return _zip_response(out, f"{stem}-{format}.zip")


def _zip_response(directory: Path, filename: str) -> Response:
    return _download(zip_bytes(directory), "application/zip", filename)


def _download(content: bytes, media_type: str, filename: str) -> Response:
    """``content`` as an attachment, with the sha256 of exactly these bytes."""
    return Response(content, media_type=media_type, headers={
        "X-Adapter-SHA256": hashlib.sha256(content).hexdigest(),
        "Content-Disposition": f'attachment; filename="{filename}"'})
