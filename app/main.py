"""``create_app``: the FastAPI application with every /v1 route behind the API key."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, status
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from rq import Worker
from sqlalchemy import text
from sqlmodel import Session

from app.api.deps import require_api_key
from app.api.routes import adapters, datasets, devices, fleets, jobs, models, plans
from app.db import database_url, make_engine
from app.devices import sync_builtin_devices
from app.keys import ensure_bootstrap_key
from app.queue import connect, enqueue_job, job_queue
from app.settings import Settings
from app.web import auth, explorer, monitor
from app.web.auth import SignInRequired
from app.web.templating import PLOTLY_JS, STATIC_DIR


def create_app(settings: Settings) -> FastAPI:
    """The app for ``settings``; its ``redis_url`` must be set (``mebp serve`` starts an
    embedded Redis when the environment has none)."""
    if settings.redis_url is None:
        raise ValueError("create_app needs settings.redis_url")
    app = FastAPI(title="mebp", version="0.1.0",
                  description="Exact, memory-efficient LoRA fine-tuning under phone-sized "
                  "memory budgets: datasets, jobs run under kernel-enforced memory caps, "
                  "adapters, device profiles and the memory/time planner.")
    app.state.settings = settings
    app.state.engine = make_engine(database_url(settings.database_url, settings.data_dir))
    with Session(app.state.engine) as session:
        sync_builtin_devices(session)
        ensure_bootstrap_key(session, settings.api_key)
    redis = connect(settings.redis_url)
    queue = job_queue(redis, settings.queue_name)
    app.state.enqueue = lambda job_id: enqueue_job(queue, job_id)

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="text/javascript")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    for module in (auth, explorer, monitor):
        app.include_router(module.router)
    app.add_exception_handler(SignInRequired, lambda request, exc: RedirectResponse(
        "/signin", status_code=status.HTTP_303_SEE_OTHER))

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
    for module in (devices, models, plans, datasets, jobs, adapters, fleets):
        v1.include_router(module.router)
    app.include_router(v1)

    @app.get("/v1/health", tags=["health"])
    @app.get("/healthz", include_in_schema=False)
    def health() -> dict:
        """Unauthenticated: the database, Redis and how many workers are listening."""
        with app.state.engine.connect() as connection:
            connection.execute(text("select 1"))
        redis.ping()
        return {"status": "ok", "database": "ok", "redis": "ok",
                "workers": Worker.count(queue=queue)}

    return app
