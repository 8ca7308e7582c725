"""``/v1/plans``: every trade-off configuration for a model on a device or budget.

Sync on purpose: planning reads this host's calibration from disk. It never measures it
here: the service does when it starts, and a plan before that is a 503."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import ValidationError
from sqlmodel import Session

from app.api.deps import SessionDep, SettingsDep
from app.api.errors import invalid, invalid_from
from app.api.model_lookup import model_architecture_or_422
from app.plan_schemas import MethodPlansPublic, PlanCreate, PlanPublic
from app.planning import device_or_422
from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.plan.arch import PlanInputError
from mebp_core.plan.methods import METHODS, MethodSettingError, plan_methods_on_host
from mebp_core.units import MB
from service.settings import Settings

router = APIRouter(prefix="/plans", tags=["plans"])


PlanAnswer = PlanPublic | MethodPlansPublic


@router.post("", response_model=PlanAnswer)
def create_plan(body: PlanCreate, settings: SettingsDep, session: SessionDep) -> PlanAnswer:
    return plan_for(body, settings, session, "body")


@router.get("", response_model=PlanAnswer)
def read_plan(query: Annotated[PlanCreate, Query()], settings: SettingsDep,
              session: SessionDep) -> PlanAnswer:
    """The same as POST, from query parameters: ``?model=&device=&seq_len=&method=``."""
    return plan_for(query, settings, session, "query")


def plan_for(body: PlanCreate, settings: Settings, session: Session, where: str) -> PlanAnswer:
    device = device_or_422(session, body.device, where=where)
    arch = model_architecture_or_422(session, body.model, where=where)
    try:
        config = TrainConfig(**body.workload(), knobs=EngineKnobs(threads=settings.plan_threads))
    except ValidationError as exc:
        raise invalid_from(exc, where=where) from None
    budget = None if body.memory_budget_mb is None else int(body.memory_budget_mb * MB)
    methods = METHODS if body.method == "all" else (body.method,)
    try:
        plans = plan_methods_on_host(arch, config, methods, budget_bytes=budget, device=device,
                                     margin=body.margin, cache_dir=settings.cache_dir,
                                     measure=False)
    except MethodSettingError as exc:
        raise invalid("method", str(exc), body.method, where=where) from None
    except PlanInputError as exc:
        raise invalid("seq_len", str(exc), body.seq_len, where=where) from None
    if body.method == "all":
        return MethodPlansPublic(**plans.to_json(body.time_tolerance))
    return PlanPublic(**plans.plans[body.method].to_json(body.time_tolerance))
