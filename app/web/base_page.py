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
from app.keys import Principal
from app.web.auth import PagePrincipal
from app.web.csrf import FormToken
from app.web.templating import templates
from mebp_core.config import TrainConfig
from mebp_core.store.export_base import BaseFormat
from service.bases import BaseRequest
from service.settings import Settings

router = APIRouter(include_in_schema=False)
PAGE_DTYPE = "float32"  # what the page offers; the API serves the others


def base_page_url(job_id: str, fmt: str) -> str:
    return f"/jobs/{quote(job_id)}/base?format={fmt}"


def _job_base(job_id: str, fmt: str, session: Session, settings: Settings,
              principal: Principal) -> tuple[dict, BaseRequest]:
    job = read_job(job_id, session, principal).model_dump(mode="json")
    try:
        config = TrainConfig.model_validate(job["config"])
    except ValidationError as exc:  # a job accepted before a bound it breaks was added
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"job {job_id}'s base cannot be exported: {exc}") from None
    return job, base_request_or_error(session, settings, job["model"], fmt=fmt,
                                      quant=config.quant, group_size=config.group_size,
                                      dtype=PAGE_DTYPE)


def _download_url(model: str, base: BaseRequest) -> str:
    query = urlencode({"format": base.fmt, "quant": base.quant,
                       "group_size": base.group_size, "dtype": base.dtype})
    return f"/v1/models/{quote(model)}/base?{query}"


@router.get("/jobs/{job_id}/base", response_class=HTMLResponse)
def base_page(job_id: str, request: Request, session: SessionDep, settings: SettingsDep,
              principal: PagePrincipal,
              format: Annotated[BaseFormat, Query()] = "hf") -> Response:
    """The download once the base is made; until then, a page to start its export or
    watch it (reloading itself until the download starts)."""
    job, base = _job_base(job_id, format, session, settings, principal)
    exports = request.app.state.base_exports
    if exports.is_kept(base):
        return RedirectResponse(_download_url(job["model"], base),
                                status_code=status.HTTP_303_SEE_OTHER)
    return _render(request, job, base, exporting=exports.exporting(base))


@router.post("/jobs/{job_id}/base", dependencies=[FormToken])
def start_base_export(job_id: str, request: Request, session: SessionDep,
                      settings: SettingsDep, principal: PagePrincipal,
                      format: Annotated[BaseFormat, Form()] = "hf") -> Response:
    job, base = _job_base(job_id, format, session, settings, principal)
    try:
        start_export(request, principal, base)
    except HTTPException as exc:  # over the quota, or the last attempt failed: say why
        return _render(request, job, base, exporting=False, error=exc.detail,
                       status_code=exc.status_code, headers=exc.headers)
    return RedirectResponse(base_page_url(job_id, format), status_code=status.HTTP_303_SEE_OTHER)


def _render(request: Request, job: dict, base: BaseRequest, *, exporting: bool,
            error: str | None = None, status_code: int = 200,
            headers: dict | None = None) -> HTMLResponse:
    return templates.TemplateResponse(request, "base_export.html", {
        "job": job, "base": base, "exporting": exporting, "error": error,
        "retry_s": EXPORT_RETRY_S}, status_code=status_code, headers=headers)
