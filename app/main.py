"""``create_app``: the FastAPI application: the dashboard at ``/``, the API under ``/v1``
behind the API keys, the reconciler that keeps the queue true to the database, and the
webhook sender."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.api.body_limit import BodyLimits
from app.api.deps import require_api_key
from app.api.errors import validation_error_response
from app.api.event_hub import EventHub
from app.api.events import StreamSlots
from app.api.openai_errors import OpenAIError
from app.api.request_sessions import SessionSlots
from app.api.routes import (
    adapters,
    checkpoints,
    comparisons,
    datasets,
    devices,
    fleet_pages,
    fleets,
    jobs,
    models,
    openai_files,
    openai_jobs,
    plans,
    webhooks,
)
from app.api.url_guard import RefuseNulInUrl
from app.calibration_gate import FAILURE_RETRY_S, RETRY_AFTER_S, CalibrationGate
from app.common_schemas import ErrorMessage
from app.keys import ensure_bootstrap_key
from app.reconciler import Reconciler
from app.uploads import storage_full_error
from app.web import auth, base_page, comparison_pages, explorer, monitor
from app.web.auth import SignInRequired
from app.web.templating import PLOTLY_JS, STATIC_DIR
from app.webhook_sender import WebhookSender
from mebp_core.cache import default_cache_dir
from mebp_core.plan.calibration import CalibrationError
from service.base_export_queue import BaseExports
from service.db import database_url, make_engine
from service.devices import sync_builtin_devices
from service.disk_space import out_of_space, storage_state
from service.export_quota import ExportQuota
from service.queue import connect, count_live_workers, enqueue_job, job_queue
from service.settings import Settings

log = logging.getLogger("mebp")
ERRORS = {code: {"model": ErrorMessage, "description": text} for code, text in (
    (400, "the body could not be parsed"), (401, "no key, or not a known one"),
    (403, "an admin key is needed"), (404, "no such resource for this tenant"),
    (409, "it exists already, or the job has finished"),
    (413, "the body or upload is larger than the limit"),
    (429, "a per-tenant or per-key limit is reached (queued jobs, open streams); retry later"),
    (503, "Redis or the database is unavailable; retry"),
    (507, "the service's storage is full"))}
# the OpenAI-compatible routes answer their 4xx in OpenAI's shape (app.api.openai_errors)
OPENAI_ERRORS = {code: {**answer, "model": OpenAIError} if code < 500 else answer
                 for code, answer in ERRORS.items()} | {
    422: {"model": OpenAIError, "description": "invalid field (error.param names it)"}}
FAVICON_URL = "/static/favicon.svg"
UNAVAILABLE = {RedisError: "the job queue (Redis) is unavailable; retry shortly",
               OperationalError: "the database is unavailable; retry shortly",
               InterfaceError: "the database is unavailable; retry shortly"}
DATABASE_DISK_FULL = "the service's storage is full: the database has no room to write; " \
    "try again later"


def create_app(settings: Settings, *, reconcile: bool = True) -> FastAPI:
    """The app for ``settings``; its ``redis_url`` must be set (``mebp serve`` starts an
    embedded Redis when the environment has none). ``reconcile``: run the reconciler and the
    webhook sender beside the routes."""
    if settings.redis_url is None:
        raise ValueError("create_app needs settings.redis_url")
    engine = make_engine(database_url(settings.database_url, settings.data_dir))
    with Session(engine) as session:
        sync_builtin_devices(session)
        if settings.api_key is not None:
            ensure_bootstrap_key(session, settings.api_key)
    redis = connect(settings.redis_url)
    queue = job_queue(redis, settings.queue_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        calibration.start()  # ready means calibrated: no request waits on a measurement
        reconciler = Reconciler(engine, queue, settings).start() if reconcile else None
        # webhooks go out from here, never from a request nor a job's engine
        sender = WebhookSender(engine, settings).start() if reconcile else None
        event_hub.start()  # one poller feeds every event stream of this process
        yield
        calibration.stop()
        await event_hub.stop()
        if sender is not None:  # first: it cancels its attempts and is gone within 1 s
            sender.stop()
        if reconciler is not None:
            reconciler.stop()

    body_limits = BodyLimits(settings)
    # /docs with its scripts served from the fastapi-offline package (no /redoc: its
    # bundle fetches a logo from a CDN)
    app = FastAPIOffline(title="mebp", version="0.1.0", lifespan=lifespan, redoc_url=None,
                         favicon_url=FAVICON_URL, max_body_size=body_limits.request_bytes,
                         description="Exact, memory-efficient LoRA fine-tuning under "
                         "phone-sized memory budgets: datasets, jobs run under kernel-enforced "
                         "memory caps, adapters, fleets, device profiles and the memory/time "
                         "planner.")
    app.state.settings, app.state.engine, app.state.redis = settings, engine, redis
    app.state.enqueue = lambda job_id: _enqueue_or_defer(queue, job_id)
    app.state.session_slots = SessionSlots(engine)
    app.state.base_exports = BaseExports(redis, settings.queue_name, settings.storage_root,
                                         settings.cache_dir or default_cache_dir(),
                                         settings.max_base_cache_bytes)
    app.state.base_export_quota = ExportQuota(redis, settings.queue_name,
                                              settings.max_base_exports_per_tenant_per_hour)
    app.state.event_hub = event_hub = EventHub(engine)
    app.state.stream_slots = StreamSlots(settings.max_streams_per_key)
    app.state.calibration = calibration = CalibrationGate(
        settings.cache_dir or default_cache_dir(), settings.plan_threads)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="text/javascript")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    for module in (auth, explorer, monitor, comparison_pages, base_page):
        app.include_router(module.router)
    app.include_router(explorer.uploads, max_body_size=body_limits.upload_bytes)
    app.add_exception_handler(SignInRequired, lambda request, exc: RedirectResponse(
        "/signin", status_code=status.HTTP_303_SEE_OTHER))
    for error, message in UNAVAILABLE.items():
        app.add_exception_handler(error, _unavailable(message))
    app.add_exception_handler(RequestValidationError, validation_error_response)
    # not measured yet (a request never measures), or unreadable: a 503 saying which
    app.add_exception_handler(CalibrationError, lambda request, exc: JSONResponse(
        {"detail": calibration.unavailable_detail(), "calibration": calibration.state()},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(FAILURE_RETRY_S if calibration.failure else RETRY_AFTER_S)}))
    app.add_exception_handler(OSError, _storage_full)
    app.add_middleware(RefuseNulInUrl)
    app.add_exception_handler(status.HTTP_413_CONTENT_TOO_LARGE, body_limits.handle)
    app.add_exception_handler(IntegrityError, lambda request, exc: JSONResponse(
        {"detail": "it conflicts with what exists (made at the same moment?); retry"},
        status_code=status.HTTP_409_CONFLICT))

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=ERRORS)
    for module in (devices, models, plans, datasets, jobs, adapters, checkpoints, fleets,
                   fleet_pages, comparisons, webhooks):
        v1.include_router(module.router)
    v1.include_router(datasets.uploads, max_body_size=body_limits.upload_bytes)
    app.include_router(v1)
    openai_v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)],
                          responses=OPENAI_ERRORS)
    openai_v1.include_router(openai_files.router)
    openai_v1.include_router(openai_jobs.router)
    openai_v1.include_router(openai_files.uploads, max_body_size=body_limits.upload_bytes)
    app.include_router(openai_v1)

    @app.get("/v1/health", tags=["health"],
             responses={503: {"description": "starting (calibration measuring) or degraded"}})
    @app.get("/healthz", include_in_schema=False)
    async def health() -> JSONResponse:
        """Unauthenticated: the database, Redis, free storage, this host's calibration
        (``measuring`` while the service starts; ``provisional`` when unsteady) and how many
        workers are listening. 200 only when every request can be answered now."""
        async with app.state.session_slots.hold():
            report = await run_in_threadpool(check_health)
        reachable = report["database"] == report["redis"] == report["storage"] == "ok"
        healthy = reachable and report["calibration"] in ("ready", "provisional")
        state = "ok" if healthy else "starting" if reachable and \
            report["calibration"] == "measuring" else "degraded"
        return JSONResponse({"status": state, **report}, status_code=200 if healthy else 503)

    def check_health() -> dict:
        report = {"database": "ok", "redis": "ok", "storage": storage_state(settings),
                  "calibration": calibration.state(), "workers": None}
        try:
            with engine.connect() as connection:
                connection.execute(text("select 1"))
        except (OperationalError, InterfaceError):
            report["database"] = "unavailable"
        try:
            report["workers"] = count_live_workers(queue)  # not the dead still listed
        except RedisError:
            report["redis"] = "unavailable"
        return report

    return app


def _enqueue_or_defer(queue, job_id: str) -> None:
    """The job is committed as queued: if Redis fails now, the reconciler enqueues it."""
    try:
        enqueue_job(queue, job_id)
    except RedisError as exc:
        log.warning("job %s stays queued in the database until Redis is back: %s", job_id, exc)


def _storage_full(request, exc: OSError) -> JSONResponse:
    """A full disk under any route is a 507, as for uploads; other OS errors stay 500s."""
    if not out_of_space(exc):
        raise exc
    answer = storage_full_error()
    return JSONResponse({"detail": answer.detail}, status_code=answer.status_code)


def _unavailable(message: str):
    def handle(request, exc) -> JSONResponse:
        if out_of_space(exc):  # the database's disk is full (SQLite's "database or disk is
            # full", PostgreSQL's 53100): it answers, and a retry in 5 s will not help
            return JSONResponse({"detail": DATABASE_DISK_FULL},
                                status_code=status.HTTP_507_INSUFFICIENT_STORAGE)
        return JSONResponse({"detail": message}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
                            headers={"Retry-After": "5"})
    return handle
