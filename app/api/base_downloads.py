"""A base export for a request, as the API route and the dashboard's job page both need it:
the model's name and the export's parameters checked before anything runs, an export
started within the tenant's quota (the callers decide who may start one: an API key, or the
dashboard's own form), and a kept export served."""

from __future__ import annotations

import os

from fastapi import HTTPException, Request, status
from fastapi.responses import FileResponse, JSONResponse
from sqlmodel import Session
from starlette.background import BackgroundTask

from app.api.errors import invalid
from app.keys import Principal
from app.model_schemas import BaseExporting
from mebp_core.errors import MebpError
from mebp_core.store.export_base_checks import check_base_format
from mebp_core.store.export_base_common import GGUF_QUANTS, BaseExportError
from mebp_core.store.model_source import source_config
from mebp_core.store.preset_configs import PRESET_PREFIX
from service.bases import BaseExportFailed, BaseRequest, ExportedBase
from service.export_quota import ExportQuotaExceeded
from service.registry import (
    ModelPathError,
    UnknownModelError,
    confine_model_dir,
    model_source,
)
from service.settings import Settings

EXPORT_RETRY_S = 5
GGUF_BLOCKS_STORE = "int4"  # the store a GGUF base of q4_1 or q8_0 blocks is made from


def base_request_or_error(session: Session, settings: Settings, name: str, *, fmt: str,
                          quant: str, group_size: int, dtype: str) -> BaseRequest:
    """The export asked for, or a 404 (no such model) or a 422 naming what it cannot do."""
    source, config = model_or_error(session, settings, name)
    try:
        return base_request(source, config, fmt=fmt, quant=quant, group_size=group_size,
                            dtype=dtype)
    except BaseExportError as exc:
        value = {"format": fmt, "quant": quant, "group_size": group_size, "dtype": dtype}
        raise invalid(exc.field, str(exc), value[exc.field], where="query") from None


def model_or_error(session: Session, settings: Settings, name: str) -> tuple[str, dict]:
    """(the model's source, its config), or a 404 (no such model) or a 422 naming it."""
    try:
        source = model_source(session, name)
        if not source.startswith(PRESET_PREFIX):
            confine_model_dir(settings.model_root_paths, source)
        return source, source_config(source)
    except UnknownModelError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"model {name!r}: {exc}") from None
    except (ModelPathError, MebpError) as exc:  # a registered directory changed since
        raise invalid("name", str(exc), name, where="path") from None


def base_request(source: str, config: dict, *, fmt: str, quant: str, group_size: int,
                 dtype: str) -> BaseRequest:
    """The export of ``source`` asked for, or a ``BaseExportError`` naming the parameter at
    fault. ``quant`` is the job's storage, or a GGUF block type made from its int4 store."""
    store_quant, gguf_quant = (GGUF_BLOCKS_STORE, quant) if quant in GGUF_QUANTS else (quant, None)
    check_base_format(config, fmt, dtype, quant=store_quant, group_size=group_size,
                      gguf_quant=gguf_quant)
    return BaseRequest(source, store_quant, group_size, fmt, dtype, gguf_quant)


def start_export(request: Request, principal: Principal, base: BaseRequest) -> None:
    """Start the export (or join it) within the tenant's quota: a 429 beyond it, naming the
    setting; a 500 once if the last attempt failed (the next start tries again)."""
    quota = request.app.state.base_export_quota
    try:
        request.app.state.base_exports.start(base, admit=lambda: quota.admit(principal.tenant))
    except ExportQuotaExceeded as exc:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"tenant {principal.tenant!r} has started {exc.limit} base exports within the "
            f"last hour, its limit (MEBP_MAX_BASE_EXPORTS_PER_TENANT_PER_HOUR); the next may "
            f"start in {exc.retry_after_s} s, and made ones are served meanwhile",
            headers={"Retry-After": str(exc.retry_after_s)}) from None
    except BaseExportFailed as exc:
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR,
                            f"exporting the base failed: {exc}") from None


def exporting_response(name: str, base: BaseRequest) -> JSONResponse:
    body = BaseExporting(detail=f"the base of {name!r} ({base.fmt}, {base.variant}) is being "
                         f"exported by a worker; ask again in {EXPORT_RETRY_S} s")
    return JSONResponse(body.model_dump(), status_code=status.HTTP_202_ACCEPTED,
                        headers={"Retry-After": str(EXPORT_RETRY_S)})


def file_response(base: ExportedBase) -> FileResponse:
    """The export's bytes from the file held open since it was found, reopened through
    /proc/self/fd: the same file even if an eviction unlinks it meanwhile (Linux only, as
    the service is); the descriptor held here is closed once the response is sent."""
    descriptor = base.file.fileno()
    return FileResponse(f"/proc/self/fd/{descriptor}", stat_result=os.fstat(descriptor),
                        media_type=base.media_type, filename=base.filename,
                        headers={"X-Base-SHA256": base.sha256},
                        background=BackgroundTask(base.file.close))
