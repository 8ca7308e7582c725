"""``/v1/models``: the presets and the models an admin registered."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import FileResponse
from sqlmodel import select

from app.api.deps import AdminDep, PrincipalDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.api.model_lookup import confined_model_path_or_422
from app.schemas import ModelCreate, ModelPublic, ModelsPublic
from mebp_core.cache import default_cache_dir
from mebp_core.config import Quant, TrainConfig
from mebp_core.errors import MebpError
from mebp_core.plan.arch import PlanInputError, load_architecture
from mebp_core.store.export_base import BASE_DTYPES, check_base_format
from mebp_core.store.preset_configs import PRESET_CONFIGS
from mebp_core.store.resolve import resolve_model, source_config
from service.bases import BaseExportFailed, exported_base
from service.models import RegisteredModel
from service.registry import (
    PRESET,
    ModelPathError,
    UnknownModelError,
    confine_model_dir,
    model_source,
)

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


_DEFAULTS = TrainConfig.model_fields
BaseFormatQuery = Annotated[Literal["hf", "gguf"], Query(
    description="hf: a Hugging Face directory, zipped under the folder name the adapters "
                "give their base; gguf: one llama.cpp file")]
QuantQuery = Annotated[Quant, Query(
    description="the storage the job trained against (its config's quant)")]
GroupSizeQuery = Annotated[int, Query(ge=8, le=4096, description="the job config's group_size")]
DtypeQuery = Annotated[Literal[BASE_DTYPES], Query(description="the weights' dtype")]


@router.get("/{name}/base", response_class=FileResponse,
            responses={200: {"content": {"application/zip": {}, "application/octet-stream": {}},
                             "headers": {"X-Base-SHA256": {
                                 "description": "sha256 of the exact bytes served"}}}})
def download_base(name: str, session: SessionDep, settings: SettingsDep, _: PrincipalDep,
                  format: BaseFormatQuery = "hf",
                  quant: QuantQuery = _DEFAULTS["quant"].default,
                  group_size: GroupSizeQuery = _DEFAULTS["group_size"].default,
                  dtype: DtypeQuery = "float32") -> FileResponse:
    """The base model a job's adapter applies to: the packed weights it was trained against,
    dequantized. Made on the first request (which can take minutes for a large model), then
    kept."""
    try:
        source = model_source(session, name)
        if not source.startswith(PRESET):
            confine_model_dir(settings.model_root_paths, source)
        check_base_format(source_config(source), format, dtype)
    except UnknownModelError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"model {name!r}: {exc}") from None
    except (ModelPathError, MebpError) as exc:
        raise invalid("format", str(exc), format, where="query") from None
    cache_dir = settings.cache_dir or default_cache_dir()
    try:
        model_dir = resolve_model(source, quant=quant, group_size=group_size,
                                  cache_dir=cache_dir, isolated=True)
        base = exported_base(settings.storage_root, model_dir, format, dtype, cache_dir)
    except (BaseExportFailed, MebpError) as exc:
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR,
                            f"exporting the base of {name!r} failed: {exc}") from None
    return FileResponse(base.path, media_type=base.media_type, filename=base.filename,
                        headers={"X-Base-SHA256": base.sha256})
