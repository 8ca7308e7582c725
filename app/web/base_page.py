"""A job's base model from its page. A signed-in browser downloads a made export; it starts
one only with this page's own form (its origin and token checked, app/web/csrf.py), never
with a GET, which a page of another origin on the same site can make with the cookie."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Form, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlmodel import Session

from app.api.base_downloads import EXPORT_RETRY_S, base_request_or_error, start_export
from app.api.deps import SessionDep, SettingsDep
from app.api.routes.jobs import read_job
from app.base_formats import download_url, list_base_exports
from app.keys import Principal
from app.web.auth import PagePrincipal
from app.web.csrf import FormToken
from app.web.templating import templates
from mebp_core.config import TrainConfig
from mebp_core.errors import MebpError
from mebp_core.store.export_base_common import BaseFormat, GGUFQuant
from mebp_core.store.model_source import source_config
from mebp_core.units import MB
from service.base_export_queue import BaseExports
from service.bases import BaseRequest
from service.registry import UnknownModelError, model_source
from service.settings import Settings

router = APIRouter(include_in_schema=False)
PAGE_DTYPE = "float32"  # what the page offers; the API serves the others
# the page's exports: the exact float32 ones and those a phone can hold
PAGE_VARIANTS = (("hf", PAGE_DTYPE, None), ("gguf", PAGE_DTYPE, None),
                 ("gguf", PAGE_DTYPE, "q4_1"), ("gguf", PAGE_DTYPE, "q8_0"),
                 ("mlx", PAGE_DTYPE, None))


def base_page_url(job_id: str, fmt: str, gguf_quant: str | None = None) -> str:
    query = urlencode({"format": fmt, **({"quant": gguf_quant} if gguf_quant else {})})
    return f"/jobs/{quote(job_id)}/base?{query}"


def base_links(exports: BaseExports, session: Session, job: dict) -> list[dict]:
    """The job page's base exports the job's model can be written in: each its label, the
    URL of its base page (which downloads a made one, or starts its export with a form) and
    its size in MB, predicted or made."""
    try:
        source = model_source(session, job["model"])
        config = TrainConfig.model_validate(job["config"])
        listed = list_base_exports(exports, job["model"], source, source_config(source),
                                   quant=config.quant, group_size=config.group_size,
                                   variants=PAGE_VARIANTS)
    except (UnknownModelError, MebpError, ValidationError):
        return []
    gguf_quants = [None if entry.quant == config.quant else entry.quant for entry in listed]
    return [{"label": " ".join(filter(None, (entry.format, gguf_quant))),
             "href": base_page_url(job["id"], entry.format, gguf_quant),
             "format": entry.format, "quant": entry.quant,
             "size": size_words(entry.predicted_bytes, entry.bytes)}
            for entry, gguf_quant in zip(listed, gguf_quants, strict=True)]


def size_words(predicted_bytes: int, made_bytes: int | None) -> str:
    if made_bytes is not None:
        return f"{made_bytes / MB:.1f} MB"
    return f"~{predicted_bytes / MB:.1f} MB predicted"


def _job_base(job_id: str, fmt: str, gguf_quant: str | None, session: Session,
              settings: Settings, principal: Principal) -> tuple[dict, BaseRequest]:
    job = read_job(job_id, session, principal).model_dump(mode="json")
    try:
        config = TrainConfig.model_validate(job["config"])
    except ValidationError as exc:  # a job accepted before a bound it breaks was added
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"job {job_id}'s base cannot be exported: {exc}") from None
    return job, base_request_or_error(session, settings, job["model"], fmt=fmt,
                                      quant=gguf_quant or config.quant,
                                      group_size=config.group_size, dtype=PAGE_DTYPE)


@router.get("/jobs/{job_id}/base", response_class=HTMLResponse)
def base_page(job_id: str, request: Request, session: SessionDep, settings: SettingsDep,
              principal: PagePrincipal, format: Annotated[BaseFormat, Query()] = "hf",
              quant: Annotated[GGUFQuant | None, Query()] = None) -> Response:
    """The download once the base is made; until then, a page to start its export or
    watch it (reloading itself until the download starts)."""
    job, base = _job_base(job_id, format, quant, session, settings, principal)
    exports = request.app.state.base_exports
    if exports.is_kept(base):
        return RedirectResponse(download_url(job["model"], base),
                                status_code=status.HTTP_303_SEE_OTHER)
    return _render(request, job, base, exporting=exports.exporting(base))


@router.post("/jobs/{job_id}/base", dependencies=[FormToken])
def start_base_export(job_id: str, request: Request, session: SessionDep,
                      settings: SettingsDep, principal: PagePrincipal,
                      format: Annotated[BaseFormat, Form()] = "hf",
                      quant: Annotated[GGUFQuant | None, Form()] = None) -> Response:
    job, base = _job_base(job_id, format, quant, session, settings, principal)
    try:
        start_export(request, principal, base)
    except HTTPException as exc:  # over the quota, or the last attempt failed: say why
        return _render(request, job, base, exporting=False, error=exc.detail,
                       status_code=exc.status_code, headers=exc.headers)
    return RedirectResponse(base_page_url(job_id, format, quant),
                            status_code=status.HTTP_303_SEE_OTHER)


def _render(request: Request, job: dict, base: BaseRequest, *, exporting: bool,
            error: str | None = None, status_code: int = 200,
            headers: dict | None = None) -> HTMLResponse:
    return templates.TemplateResponse(request, "base_export.html", {
        "job": job, "base": base, "exporting": exporting, "error": error,
        "retry_s": EXPORT_RETRY_S}, status_code=status_code, headers=headers)
