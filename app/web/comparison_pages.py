"""The comparison pages: the list, a comparison's curves in phone time (polled while its jobs
run), and the form that starts one (the explorer links to it with its model and device)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.api.deps import SessionDep, SettingsDep
from app.api.routes.comparisons import cancel_comparison, list_comparisons, read_comparison
from app.comparison_schemas import DEFAULT_LEARNING_RATES
from app.comparison_submit import submit_comparison
from app.web.auth import PagePrincipal
from app.web.comparison_form import METHODS, ComparisonForm, describe, shared_inputs
from app.web.csrf import FormToken, SameOrigin, require_form_token
from app.web.explorer import choices
from app.web.templating import script_json, templates

router = APIRouter(include_in_schema=False)


@router.get("/comparisons", response_class=HTMLResponse)
def comparisons_page(request: Request, session: SessionDep,
                     principal: PagePrincipal) -> HTMLResponse:
    listed = list_comparisons(session, principal, model=None, device=None, limit=100)
    rows = listed.model_dump(mode="json")["data"]
    return templates.TemplateResponse(request, "comparisons.html", {"comparisons": rows})


@router.get("/comparisons/new", response_class=HTMLResponse)
def comparison_form(request: Request, session: SessionDep, principal: PagePrincipal,
                    model: str = ComparisonForm().model, device: str = ComparisonForm().device,
                    seq_len: str = "") -> HTMLResponse:
    """Prefilled from the query (the explorer's button: its model, device and length)."""
    form = ComparisonForm(model=model, device=device,
                          hyperparameters={"seq_len": seq_len} if seq_len else {})
    return _render_form(request, session, principal, form, None)


@router.post("/comparisons/new", response_class=HTMLResponse, dependencies=[SameOrigin])
async def submit_form(request: Request, session: SessionDep, settings: SettingsDep,
                      principal: PagePrincipal):
    """As the job form: the origin and session checked before the body is read, the token
    after, and no database slot held while the form arrives."""
    await run_in_threadpool(session.close)
    fields = await request.form(max_files=0, max_fields=64)
    await require_form_token(request)
    single = {name: value for name, value in fields.items() if isinstance(value, str)}
    methods = [value for value in fields.getlist("methods") if isinstance(value, str)]
    state = request.app.state
    async with state.session_slots.hold():
        return await run_in_threadpool(_submit_in_a_session, request, state.engine, settings,
                                       principal, single, methods)


def _submit_in_a_session(request: Request, engine, settings, principal, single: dict,
                         methods: list[str]) -> HTMLResponse:
    with Session(engine) as session:
        try:
            form = ComparisonForm.from_fields(single, methods)
        except ValidationError as exc:
            return _render_form(request, session, principal, ComparisonForm(), describe(exc),
                                status.HTTP_422_UNPROCESSABLE_CONTENT)
        try:
            comparison = submit_comparison(session, form.to_comparison(), settings,
                                           request.app.state.enqueue,
                                           tenant=principal.tenant,
                                           redis=request.app.state.redis)
        except (RequestValidationError, ValidationError, ValueError) as exc:
            return _render_form(request, session, principal, form, describe(exc),
                                status.HTTP_422_UNPROCESSABLE_CONTENT)
        except HTTPException as exc:  # the tenant's queue is full (429)
            return _render_form(request, session, principal, form, str(exc.detail),
                                exc.status_code)
        return RedirectResponse(f"/comparisons/{comparison.id}",
                                status_code=status.HTTP_303_SEE_OTHER)


def _render_form(request: Request, session, principal, form: ComparisonForm, error: str | None,
                 status_code: int = 200) -> HTMLResponse:
    return templates.TemplateResponse(request, "comparison_form.html", {
        "form": form.model_dump(), "error": error, "methods": METHODS,
        "default_rates": {m: ", ".join(f"{r:g}" for r in rates)
                          for m, rates in DEFAULT_LEARNING_RATES.items()},
        "hyperparameters": shared_inputs(form.hyperparameters),
        **choices(session, principal.tenant)}, status_code=status_code)


@router.get("/comparisons/{comparison_id}", response_class=HTMLResponse)
def comparison_page(comparison_id: str, request: Request, session: SessionDep,
                    principal: PagePrincipal) -> HTMLResponse:
    comparison = read_comparison(comparison_id, session, principal).model_dump(mode="json")
    return templates.TemplateResponse(request, "comparison.html", {
        "comparison": comparison, "comparison_json": script_json(comparison)})


@router.post("/comparisons/{comparison_id}/cancel", dependencies=[FormToken])
def cancel_from_page(comparison_id: str, session: SessionDep,
                     principal: PagePrincipal) -> RedirectResponse:
    cancel_comparison(comparison_id, session, principal)
    return RedirectResponse(f"/comparisons/{comparison_id}",
                            status_code=status.HTTP_303_SEE_OTHER)
