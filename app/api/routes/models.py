"""``/v1/models``: the presets and the models an admin registered."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from sqlmodel import select

from app.api.deps import AdminDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.api.model_lookup import confined_model_path_or_422
from app.schemas import ModelCreate, ModelPublic, ModelsPublic
from mebp_core.plan.arch import PlanInputError, load_architecture
from mebp_core.store.preset_configs import PRESET_CONFIGS
from service.models import RegisteredModel
from service.registry import PRESET

router = APIRouter(prefix="/models", tags=["models"])


@router.get("", response_model=ModelsPublic)
def list_models(session: SessionDep) -> ModelsPublic:
    models = []
    for name in sorted(PRESET_CONFIGS):
        arch = load_architecture(PRESET + name)
        models.append(ModelPublic(name=PRESET + name, source="preset",
                                  model_type=arch.model_type,
                                  parameters=arch.parameter_count()))
    for row in session.exec(select(RegisteredModel).order_by(RegisteredModel.name)):
        models.append(ModelPublic(name=row.name, source="registered", model_type=row.model_type,
                                  parameters=row.parameters))
    return ModelsPublic(data=models, count=len(models))


@router.post("", response_model=ModelPublic, status_code=status.HTTP_201_CREATED)
def register_model(body: ModelCreate, session: SessionDep, settings: SettingsDep,
                   _: AdminDep) -> ModelPublic:
    """Admins only. The path must lie inside MEBP_MODEL_ROOTS; jobs then name the model."""
    if session.get(RegisteredModel, body.name) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"model {body.name!r} is registered")
    path = confined_model_path_or_422(settings, body.path)
    try:
        arch = load_architecture(str(path))
    except PlanInputError as exc:
        raise invalid("path", str(exc), body.path) from None
    row = RegisteredModel(name=body.name, path=str(path), model_type=arch.model_type,
                          parameters=arch.parameter_count())
    session.add(row)
    session.commit()
    return ModelPublic(name=row.name, source="registered", model_type=row.model_type,
                       parameters=row.parameters)
