"""Model bodies: presets and registered models, and the base-weight exports made of them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.api.request_model import RequestModel
from app.common_schemas import ID_PATTERN


class ModelCreate(RequestModel):
    name: str = Field(pattern=ID_PATTERN, max_length=64, examples=["my-qwen"])
    path: str = Field(min_length=1, max_length=1024,
                      description="a Hugging Face model directory inside the model roots")


class BaseExporting(BaseModel):
    status: Literal["exporting"] = "exporting"
    detail: str


class BaseExportPublic(BaseModel):
    format: str
    quant: str = Field(description="the query's quant: the job's storage, or a GGUF block type")
    group_size: int
    dtype: str
    exact: bool = Field(description="whether the runtime's weights are the packed ones the "
                                    "adapter trained against, bit for bit")
    predicted_bytes: int = Field(description="the weights' bytes, from the model's shapes; "
                                             "the file adds its metadata (a few KB)")
    bytes: int | None = Field(description="the made file's size, once it is kept")
    status: Literal["kept", "queued", "exporting", "not_exported"] = Field(
        description="kept; queued for the exports worker; exporting (being made); or neither")
    url: str


class BaseExportsPublic(BaseModel):
    object: Literal["list"] = "list"
    data: list[BaseExportPublic]
    count: int


class ModelPublic(BaseModel):
    id: str = Field(description="its name, as OpenAI's model objects carry it")
    object: Literal["model"] = "model"
    created: int = Field(description="unix seconds it was registered; 0 for a preset")
    owned_by: str = "mebp"
    name: str
    source: Literal["preset", "registered"]
    model_type: str
    parameters: int
    pretrained: bool | None = Field(description=(
        "true: weights trained on text (a shipped preset, e.g. preset:pycode-12m); false: "
        "seeded random weights for simulation; null: a registered model, whose weights the "
        "service does not judge"))


class ModelsPublic(BaseModel):
    data: list[ModelPublic]
    count: int
