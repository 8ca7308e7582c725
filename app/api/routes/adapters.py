"""``GET /v1/jobs/{id}/adapter``: the adapter a job trained, as a PEFT zip or exported."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import Response

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.routes.jobs import get_job_or_404
from mebp_core.lora.export import export_adapter
from service.crud import latest_adapter
from service.storage import base_config_path

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("/{job_id}/adapter", response_class=Response,
            responses={200: {"content": {"application/zip": {},
                                         "application/octet-stream": {}}}})
def download_adapter(job_id: str, session: SessionDep, settings: SettingsDep,
                     principal: PrincipalDep,
                     format: Literal["peft", "mlx", "gguf"] = Query(
                         "peft", description="peft and mlx come zipped; gguf is one file")
                     ) -> Response:
    job = get_job_or_404(session, job_id, principal)
    adapter = latest_adapter(session, job.id)
    if adapter is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"job {job_id} has no adapter (status {job.status})")
    source = Path(adapter.path)
    headers = {"X-Adapter-SHA256": adapter.sha256}
    if format == "peft":
        return _zip_response(source, f"{job_id}-peft.zip", headers)
    base_config = json.loads(base_config_path(settings.storage_root, job.id).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        out = export_adapter(source, format, Path(tmp) / format, base_config=base_config)
        if format == "gguf":
            return Response(out.read_bytes(), media_type="application/octet-stream",
                            headers={**headers, "Content-Disposition":
                                     f'attachment; filename="{job_id}.gguf"'})
        return _zip_response(out, f"{job_id}-{format}.zip", headers)


def _zip_response(directory: Path, filename: str, headers: dict) -> Response:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())
    return Response(buffer.getvalue(), media_type="application/zip",
                    headers={**headers,
                             "Content-Disposition": f'attachment; filename="{filename}"'})
