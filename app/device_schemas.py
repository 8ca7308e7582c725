"""Device profile bodies: the profiles a plan or job names, and the one an admin adds."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from app.api.request_model import RequestModel
from app.common_schemas import ID_PATTERN


class DevicePublic(BaseModel):
    id: str
    name: str
    ram_mb: int | None
    budget_mb: int | None = Field(description="memory a fine-tuning task may use")
    chip: str | None
    relative_compute_estimate: float | None
    effective_gflops_estimate: float | None = Field(
        description="an estimate, used only for on-device step-time estimates")
    memory_gb_s: float | None = Field(default=None, description=(
        "an estimate of its memory bandwidth: decompression and elementwise traffic"))
    sources: list[str]


class DevicesPublic(BaseModel):
    data: list[DevicePublic]
    count: int


class DeviceCreate(RequestModel):
    """A device profile an admin adds (the built-in ones come from devices.json)."""

    id: str = Field(pattern=ID_PATTERN, max_length=64, examples=["pixel-9a"])
    name: str = Field(min_length=1, max_length=128)
    ram_mb: int | None = Field(default=None, ge=256, le=1 << 20)
    budget_mb: int = Field(ge=64, le=1 << 20)
    chip: str | None = Field(default=None, max_length=128)
    relative_compute: float | None = Field(default=None, gt=0, le=1000, description=(
        "compute against the iPhone 15 Pro Max (1.0), for on-device time estimates"))
    sources: list[Annotated[str, StringConstraints(max_length=1024)]] = Field(
        default_factory=list, max_length=16)
