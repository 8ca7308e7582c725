"""The trade-off explorer and the job form it opens: every configuration of a model on a
phone as a point, and a click away from running one."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, UploadFile, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError
from sqlmodel import Session, col, select
from starlette.concurrency import run_in_threadpool

from app.api.deps import SessionDep, SettingsDep
from app.api.routes.plans import plan_for
from app.comparison_schemas import DEFAULT_METHODS
from app.plan_schemas import PlanCreate
from app.submit import submit_job
from app.training_schemas import Hyperparameters
from app.uploads import store_upload
from app.web.auth import PagePrincipal
from app.web.csrf import SameOrigin, require_form_token
from app.web.explorer_comparison import latest_comparison
from app.web.explorer_plans import COMPUTE_DTYPES, METHOD_CHOICES, plan_view
from app.web.job_form import JobForm, hyperparameter_inputs
from app.web.measured import measured_points
from app.web.templating import script_json, templates
from mebp_core.plan.calibration import CalibrationError
from mebp_core.plan.methods import METHOD_NAMES, METHODS
from mebp_core.store.preset_configs import PRESET_CONFIGS
from service.devices import all_devices
from service.models import Dataset, RegisteredModel

router = APIRouter(include_in_schema=False)
uploads = APIRouter(include_in_schema=False)  # the job form takes a dataset: the upload limit
DEFAULTS = {"model": "preset:qwen2.5-0.5b", "device": "iphone-15-pro-max", "seq_len": 256,
            "method": "mebp"}


def choices(session, tenant: str) -> dict:
    registered = session.exec(select(RegisteredModel.name).order_by(RegisteredModel.name))
    return {"models": [f"preset:{name}" for name in sorted(PRESET_CONFIGS)] + list(registered),
            "devices": list(all_devices(session).values()),
            # whole uploads first (the form's default), then fleets' shards
            "datasets": session.exec(select(Dataset).where(Dataset.tenant == tenant)
                                     .order_by(col(Dataset.source_id).is_not(None),
                                               Dataset.created_at.desc())
                                     .limit(50)).all()}


@router.get("/explorer", response_class=HTMLResponse)
def explorer(request: Request, session: SessionDep, settings: SettingsDep,
             principal: PagePrincipal,
             model: str = DEFAULTS["model"], device: str = "", budget_mb: str = "",
             seq_len: int = DEFAULTS["seq_len"], method: str = DEFAULTS["method"],
             compare_device: str = "", compare_seq_len: str = "",
             time_tolerance: str = "", compute_dtype: str = "") -> HTMLResponse:
    device = device if device or budget_mb else DEFAULTS["device"]
    form = {"model": model, "device": device, "budget_mb": budget_mb, "seq_len": seq_len,
            "method": method, "compare_device": compare_device,
            "compare_seq_len": compare_seq_len, "time_tolerance": time_tolerance,
            "compute_dtype": compute_dtype}
    # the setting every chart's plans share (blank: the API's default)
    setting = {k: form[k] for k in ("time_tolerance", "compute_dtype") if form[k]}
    view, error, measured, compared = None, None, [], None
    try:
        view, measured = _plan_and_measured(session, settings, principal, model, device,
                                            budget_mb, seq_len, method, setting)
        if compare_device or compare_seq_len:  # the same query but for the device or length
            other_device = compare_device or device
            compared = dict(zip(("view", "measured"), _plan_and_measured(
                session, settings, principal, model, other_device,
                "" if compare_device else budget_mb,
                int(compare_seq_len) if compare_seq_len else seq_len, method,
                setting), strict=True))
            compared["label"] = _label(other_device, budget_mb if not compare_device else "",
                                       int(compare_seq_len or seq_len))
    except (RequestValidationError, ValidationError, ValueError) as exc:
        error = _describe(exc)
    except CalibrationError:  # the service is starting, or its calibration failed
        error = request.app.state.calibration.unavailable_detail()
    charts = [] if view is None else [
        _chart(_label(device, budget_mb, seq_len), view, measured)]
    if compared is not None:
        charts.append(_chart(compared["label"], compared["view"], compared["measured"]))
    return templates.TemplateResponse(request, "explorer.html", {
        "form": form, "view": view, "error": error, "compared": compared,
        "methods": METHOD_CHOICES, "method_names": METHOD_NAMES, "dtypes": COMPUTE_DTYPES,
        "comparison_methods": comparison_methods(method),
        "comparison": None if not device else latest_comparison(
            session, tenant=principal.tenant, model=model, device=device),
        **choices(session, principal.tenant),
        "chart": script_json({"charts": charts})})


def _plan_and_measured(session, settings, principal, model: str, device: str, budget_mb: str,
                       seq_len: int, method: str, setting: dict) -> tuple[dict, list[dict]]:
    query = PlanCreate(model=model, seq_len=seq_len, device=device or None,
                       memory_budget_mb=float(budget_mb) if budget_mb else None,
                       method=method, **setting)
    view = plan_view(plan_for(query, settings, session, "query").model_dump(mode="json"))
    return view, measured_points(session, query, principal.tenant, tuple(view["plans"]))


def _chart(label: str, view: dict, measured: list[dict]) -> dict:
    recommendation = view["recommendation"]
    return {"label": label, "plans": view["plans"], "names": view["names"],
            "recommended": recommendation and recommendation["configuration"],
            "measured": measured}


def comparison_methods(method: str) -> list[str]:
    """What the explorer's comparison button compares: every method under ``all``, else
    MeBP against MeZO (the paper's question) and the method shown."""
    return list(METHODS) if method == "all" else list(dict.fromkeys([*DEFAULT_METHODS, method]))


def _label(device: str, budget_mb: str, seq_len: int) -> str:
    return f"{device or f'{budget_mb} MB'}, seq {seq_len}"


@router.get("/jobs/new", response_class=HTMLResponse)
def job_form(request: Request, session: SessionDep, principal: PagePrincipal,
             model: str = DEFAULTS["model"],
             device: str = "", budget_mb: str = "", seq_len: int = DEFAULTS["seq_len"],
             method: str = DEFAULTS["method"], config: str = "auto",
             configuration: str = "auto", compute_dtype: str = "") -> HTMLResponse:
    try:  # the explorer's setting, as it planned it (blank: the API's default)
        form, error = JobForm(model=model, device=device, memory_budget_mb=budget_mb,
                              method=method, config=config, configuration=configuration,
                              hyperparameters={"seq_len": str(seq_len),
                                               "compute_dtype": compute_dtype}), None
    except ValidationError as exc:  # a hand-edited link: start from the defaults, say why
        form, error = JobForm(model=model), _describe(exc)
    return _render_form(request, session, principal, form.model_dump(), error)


@uploads.post("/jobs/new", response_class=HTMLResponse, dependencies=[SameOrigin])
async def submit_form(request: Request, session: SessionDep, settings: SettingsDep,
                      principal: PagePrincipal):
    """No form parameters: FastAPI would read (and spool) the body before the origin and the
    session were checked. The form is parsed here, after both, then its token checked; while
    it arrives the request holds no database slot (a few slow posts held them all)."""
    await run_in_threadpool(session.close)
    fields = await request.form(max_files=1, max_fields=64)
    await require_form_token(request)  # reads the same parsed form
    state = request.app.state
    async with state.session_slots.hold():
        return await run_in_threadpool(_submit_form_in_a_session, request, state.engine,
                                       settings, principal, fields)


def _submit_form_in_a_session(request: Request, engine, settings, principal,
                              fields) -> HTMLResponse:
    with Session(engine) as session:
        return _submit_form(request, session, settings, principal, fields)


def _submit_form(request: Request, session, settings, principal, fields) -> HTMLResponse:
    values = {name: value for name, value in fields.items() if isinstance(value, str)}
    file = fields.get("file")
    try:
        form = JobForm.from_fields(values)
        values = form.model_dump()
        training_file = form.training_file
        if isinstance(file, UploadFile) and file.filename:
            training_file = store_upload(session, settings, file, tenant=principal.tenant).id
        job = submit_job(session, form.to_job(training_file), settings,
                         request.app.state.enqueue, tenant=principal.tenant,
                         redis=request.app.state.redis)
    except (RequestValidationError, ValidationError) as exc:
        return _render_form(request, session, principal, values, _describe(exc),
                            status.HTTP_422_UNPROCESSABLE_CONTENT)
    except HTTPException as exc:  # the upload: too large, or malformed
        return _render_form(request, session, principal, values, str(exc.detail),
                            exc.status_code)
    except ValueError as exc:  # the form's own text fields: the knobs' JSON, the budget
        return _render_form(request, session, principal, values, f"invalid field: {exc}",
                            status.HTTP_422_UNPROCESSABLE_CONTENT)
    return RedirectResponse(f"/jobs/{job.id}", status_code=status.HTTP_303_SEE_OTHER)


def _render_form(request: Request, session, principal, form: dict, error: str | None,
                 status_code: int = 200) -> HTMLResponse:
    hyper = form.get("hyperparameters") or {k: v for k, v in form.items()
                                             if k in Hyperparameters.model_fields}
    return templates.TemplateResponse(request, "job_form.html",
                                      {"form": form, "error": error,
                                       "hyperparameters": hyperparameter_inputs(hyper),
                                       **choices(session, principal.tenant)},
                                      status_code=status_code)


def _describe(exc: Exception) -> str:
    if isinstance(exc, RequestValidationError | ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'][1:] or e['loc']))}: {e['msg']}"
                         for e in exc.errors())
    return str(exc)

