"""``/v1/models``: the presets and the models an admin registered."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import FileResponse, Response
from sqlmodel import select

from app.api.base_downloads import (
    base_request_or_error,
    exporting_response,
    file_response,
    model_or_error,
    start_export,
)
from app.api.deps import AdminDep, BearerCredentials, PrincipalDep, SessionDep, SettingsDep
from app.api.errors import invalid
from app.api.model_lookup import confined_model_path_or_422
from app.base_formats import list_base_exports
from app.model_schemas import (
    BaseExporting,
    BaseExportsPublic,
    ModelCreate,
    ModelPublic,
    ModelsPublic,
)
from app.openai_view import unix_seconds
from mebp_core.config import GroupSize, Quant, TrainConfig
from mebp_core.errors import MebpError
from mebp_core.plan.arch import PlanInputError, load_architecture
from mebp_core.store.export_base_common import BASE_DTYPES, GGUF_QUANTS, BaseFormat
from mebp_core.store.preset_configs import PRESET_CONFIGS, PRESET_PREFIX, SHIPPED_PRESETS
from service.models import RegisteredModel

router = APIRouter(prefix="/models", tags=["models"])


@router.get("", response_model=ModelsPublic)
def list_models(session: SessionDep) -> ModelsPublic:
    models = [preset_public(name) for name in sorted(PRESET_CONFIGS)]
    models += [registered_public(row) for row in
               session.exec(select(RegisteredModel).order_by(RegisteredModel.name))]
    return ModelsPublic(data=models, count=len(models))


@router.get("/{name}", response_model=ModelPublic)
def read_model(name: str, session: SessionDep) -> ModelPublic:
    if name.startswith(PRESET_PREFIX) and name.removeprefix(PRESET_PREFIX) in PRESET_CONFIGS:
        return preset_public(name.removeprefix(PRESET_PREFIX))
    row = session.get(RegisteredModel, name)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no model {name!r}")
    return registered_public(row)


def preset_public(name: str) -> ModelPublic:
    spec = PRESET_PREFIX + name
    arch = load_architecture(spec)
    return ModelPublic(id=spec, name=spec, created=0, source="preset",
                       model_type=arch.model_type, parameters=arch.parameter_count(),
                       pretrained=name in SHIPPED_PRESETS)


def registered_public(row: RegisteredModel) -> ModelPublic:
    return ModelPublic(id=row.name, name=row.name, created=unix_seconds(row.created_at),
                       source="registered", model_type=row.model_type,
                       parameters=row.parameters, pretrained=None)


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
    return registered_public(row)


_DEFAULTS = TrainConfig.model_fields
BaseFormatQuery = Annotated[BaseFormat, Query(
    description="hf: a Hugging Face directory, zipped under the folder name the adapters "
                "give their base; gguf: one llama.cpp file; mlx: the packed int4/int8 "
                "weights as MLX quantized ones (mlx_lm.load), zipped")]
QuantQuery = Annotated[Literal[get_args(Quant) + GGUF_QUANTS], Query(
    description="the storage the job trained against (its config's quant: none, int8, "
                "int4); with format=gguf, q4_1 (that int4 store exactly, in llama.cpp's "
                "blocks) or q8_0 (an 8-bit approximation of it)")]
StoreQuantQuery = Annotated[Quant, Query(description="the job config's quant")]
GroupSizeQuery = Annotated[GroupSize, Query(description="the job config's group_size")]
DtypeQuery = Annotated[Literal[BASE_DTYPES], Query(
    description="the weights' dtype; mlx: its scales' and biases' (float32: exact)")]


@router.get("/{name}/base/formats", response_model=BaseExportsPublic)
def list_base_formats(name: str, request: Request, session: SessionDep, settings: SettingsDep,
                      _: PrincipalDep, quant: StoreQuantQuery = _DEFAULTS["quant"].default,
                      group_size: GroupSizeQuery = _DEFAULTS["group_size"].default
                      ) -> BaseExportsPublic:
    """The exports of the base a job stored ``quant`` / ``group_size`` trained against, each
    with its size: the weights' bytes predicted from the model's shapes, and the made file's
    once kept (``status`` kept, exporting on a worker, or not_exported); ``url`` downloads
    it (or starts its export, with the API key)."""
    source, config = model_or_error(session, settings, name)
    session.close()  # what follows reads headers, files and Redis only
    try:
        listed = list_base_exports(request.app.state.base_exports, name, source, config,
                                   quant=quant, group_size=group_size)
    except MebpError as exc:  # a registered directory's weights changed since
        raise invalid("name", str(exc), name, where="path") from None
    return BaseExportsPublic(data=listed, count=len(listed))


@router.get("/{name}/base", response_class=FileResponse,
            responses={200: {"content": {"application/zip": {}, "application/octet-stream": {}},
                             "headers": {"X-Base-SHA256": {
                                 "description": "sha256 of the exact bytes served"}}},
                       202: {"description": "being exported: ask again after Retry-After",
                             "model": BaseExporting},
                       409: {"description": "not exported yet, and a signed-in browser's "
                                            "cookie alone does not start an export"}})
def download_base(name: str, request: Request, session: SessionDep, settings: SettingsDep,
                  principal: PrincipalDep, credentials: BearerCredentials,
                  format: BaseFormatQuery = "hf",
                  quant: QuantQuery = _DEFAULTS["quant"].default,
                  group_size: GroupSizeQuery = _DEFAULTS["group_size"].default,
                  dtype: DtypeQuery = "float32") -> Response:
    """The base model a job's adapter applies to: the packed weights it was trained against,
    dequantized (hf, gguf) or as they are (mlx, gguf with quant=q4_1). A request with an API
    key queues its export on the workers (minutes for a large model;
    MEBP_MAX_BASE_EXPORTS_PER_TENANT_PER_HOUR per tenant) and is answered 202; once made,
    it is kept (within MEBP_MAX_BASE_CACHE_BYTES) and served to the key and to the signed-in
    dashboard, whose own job page starts exports with a form."""
    base = base_request_or_error(session, settings, name, fmt=format, quant=quant,
                                 group_size=group_size, dtype=dtype)
    # what follows reads files and Redis only, and a yield dependency ends once the
    # response is sent: a slow client's download must not hold a database slot
    session.close()
    exports = request.app.state.base_exports
    kept = exports.open(base)
    if kept is not None:
        return file_response(kept)
    if credentials is not None:  # a cross-site page can send the cookie, never a key
        start_export(request, principal, base)
    elif not exports.exporting(base):
        raise HTTPException(status.HTTP_409_CONFLICT, (
            f"the base of {name!r} ({format}, {base.variant}, {quant}, group_size {group_size}) is "
            "not exported yet; a signed-in browser only downloads made ones: start its "
            "export from the job's page, or ask with the API key (Authorization: Bearer)"))
    return exporting_response(name, base)
