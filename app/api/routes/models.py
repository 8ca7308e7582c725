"""``/v1/models``: the presets and the models an admin registered."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import FileResponse, JSONResponse, Response
from sqlmodel import select

from app.api.deps import AdminDep, PrincipalDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.api.model_lookup import confined_model_path_or_422
from app.schemas import BaseExporting, ModelCreate, ModelPublic, ModelsPublic
from mebp_core.config import GroupSize, Quant, TrainConfig
from mebp_core.errors import MebpError
from mebp_core.plan.arch import PlanInputError, load_architecture
from mebp_core.store.export_base import BASE_DTYPES, check_base_format
from mebp_core.store.preset_configs import PRESET_CONFIGS
from mebp_core.store.resolve import source_config
from service.bases import BaseExportFailed, BaseRequest
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
EXPORT_RETRY_S = 5
BaseFormatQuery = Annotated[Literal["hf", "gguf"], Query(
    description="hf: a Hugging Face directory, zipped under the folder name the adapters "
                "give their base; gguf: one llama.cpp file")]
QuantQuery = Annotated[Quant, Query(
    description="the storage the job trained against (its config's quant)")]
GroupSizeQuery = Annotated[GroupSize, Query(description="the job config's group_size")]
DtypeQuery = Annotated[Literal[BASE_DTYPES], Query(description="the weights' dtype")]


@router.get("/{name}/base", response_class=FileResponse,
            responses={200: {"content": {"application/zip": {}, "application/octet-stream": {}},
                             "headers": {"X-Base-SHA256": {
                                 "description": "sha256 of the exact bytes served"}}},
                       202: {"description": "being exported: ask again after Retry-After",
                             "model": BaseExporting}})
def download_base(name: str, request: Request, session: SessionDep, settings: SettingsDep,
                  _: PrincipalDep, format: BaseFormatQuery = "hf",
                  quant: QuantQuery = _DEFAULTS["quant"].default,
                  group_size: GroupSizeQuery = _DEFAULTS["group_size"].default,
                  dtype: DtypeQuery = "float32") -> Response:
    """The base model a job's adapter applies to: the packed weights it was trained against,
    dequantized. The first request starts its export (minutes for a large model) and is
    answered 202; once made, it is kept and served."""
    try:
        source = model_source(session, name)
        if not source.startswith(PRESET):
            confine_model_dir(settings.model_root_paths, source)
        config = source_config(source)
    except UnknownModelError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"model {name!r}: {exc}") from None
    except (ModelPathError, MebpError) as exc:  # a registered directory changed since
        raise invalid("name", str(exc), name, where="path") from None
    try:
        check_base_format(config, format, dtype)
    except MebpError as exc:
        raise invalid("format", str(exc), format, where="query") from None
    try:
        base = request.app.state.base_exports.find_or_start(
            BaseRequest(source, quant, group_size, format, dtype))
    except BaseExportFailed as exc:  # the next request tries again
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR,
                            f"exporting the base of {name!r} failed: {exc}") from None
    if base is None:
        body = BaseExporting(detail=f"the base of {name!r} ({format}, {dtype}) is being "
                             f"exported; ask again in {EXPORT_RETRY_S} s")
        return JSONResponse(body.model_dump(), status_code=status.HTTP_202_ACCEPTED,
                            headers={"Retry-After": str(EXPORT_RETRY_S)})
    return FileResponse(base.path, media_type=base.media_type, filename=base.filename,
                        headers={"X-Base-SHA256": base.sha256})
