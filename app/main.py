"""``create_app``: the FastAPI application with every /v1 route behind the API key."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI

from app.api.deps import require_api_key
from app.api.routes import devices, plans
from app.settings import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    app = FastAPI(title="mebp", version="0.1.0",
                  description="Exact, memory-efficient LoRA fine-tuning under phone-sized "
                  "memory budgets: device profiles and the memory/time planner.")
    app.state.settings = settings or Settings()
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
    v1.include_router(devices.router)
    v1.include_router(plans.router)
    app.include_router(v1)

    @app.get("/healthz", tags=["health"])
    def health() -> dict:
        return {"status": "ok"}

    return app
