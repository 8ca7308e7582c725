"""Request and response bodies, one model per shape."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DevicePublic(BaseModel):
    id: str
    name: str
    ram_mb: int | None
    budget_mb: int | None = Field(description="memory a fine-tuning task may use")
    chip: str | None
    relative_compute_estimate: float | None
    effective_gflops_estimate: float | None = Field(
        description="an estimate, used only for on-device step-time estimates")
    sources: list[str]


class DevicesPublic(BaseModel):
    data: list[DevicePublic]
    count: int


class PlanCreate(BaseModel):
    """A model and a training setting; the planner predicts every trade-off configuration."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="preset:NAME", examples=["preset:qwen2.5-0.5b"])
    seq_len: int = Field(default=256, ge=2, le=131_072)
    batch_size: int = Field(default=1, ge=1, le=1024)
    lora_rank: int = Field(default=8, ge=1, le=1024)
    lora_alpha: float = Field(default=16.0, gt=0)
    lora_targets: str | list[str] = "all"
    optimizer: Literal["sgd", "adamw"] = "sgd"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    quant: Literal["none", "int8", "int4"] = "int4"
    group_size: int = Field(default=64, ge=8, le=4096)
    device: str | None = Field(default=None, description="a device profile id")
    memory_budget_mb: float | None = Field(default=None, gt=0, le=1 << 20,
                                           description="overrides the device's budget")
    margin: float = Field(default=0.10, ge=0, le=1)


class ConfigurationPublic(BaseModel):
    id: str
    knobs: dict
    peak_mb: float
    memory_mb: dict[str, float]
    step_time_s: float
    time_s: dict[str, float]
    feasible: bool | None
    reason: str | None
    pareto: bool
    device_step_time_s_estimate: float | None


class PlanPublic(BaseModel):
    workload: dict
    budget_mb: float | None
    margin: float
    device: DevicePublic | None
    auto: str | None = Field(description="the fastest configuration that fits")
    feasible: bool | None
    smallest_budget_mb: int
    dominant_component: str
    pareto: list[str]
    configurations: list[ConfigurationPublic]
