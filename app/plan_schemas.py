"""Plan bodies: a model and training setting in, every trade-off configuration's predicted
memory and time out, with the recommendation."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.common_schemas import Name
from app.device_schemas import DevicePublic
from app.training_schemas import WorkloadFields
from mebp_core.plan.planner import DEFAULT_MARGIN, DEFAULT_TIME_TOLERANCE


class PlanCreate(WorkloadFields):
    """A model and a training setting; the planner predicts every trade-off configuration."""

    model: Name = Field(description="preset:NAME or a registered model",
                        examples=["preset:qwen2.5-0.5b"])
    device: Name | None = Field(default=None, description="a device profile id")
    memory_budget_mb: float | None = Field(default=None, gt=0, le=1 << 20,
                                           description="overrides the device's budget")
    margin: float = Field(default=DEFAULT_MARGIN, ge=0, le=1, description=(
        "a configuration fits when its predicted peak times (1 + margin) is within budget"))
    time_tolerance: float = Field(default=DEFAULT_TIME_TOLERANCE, ge=0, le=0.5, description=(
        "the recommendation is the smallest configuration that fits whose step time is "
        "within this fraction of the fastest one's (0: the fastest, auto)"))
    method: Literal["mebp", "mezo", "backprop", "all"] = Field(default="mebp", description=(
        "the training method to plan, or all: each method's plan, labelled, and which to run"))


class ConfigurationPublic(BaseModel):
    id: str
    method: str = Field(description="mebp, mezo or backprop")
    knobs: dict
    peak_mb: float
    memory_mb: dict[str, float]
    step_time_s: float
    time_s: dict[str, float]
    feasible: bool | None
    reason: str | None
    pareto: bool
    device_step_time_s_estimate: float | None


class CalibrationPublic(BaseModel):
    """The host calibration a plan's predictions came from."""

    host: str
    threads: int
    torch: str
    kernel: str = Field(description="the dequantization kernel timed: native library or torch")
    allocator: str = Field(default="glibc", description=(
        "the malloc this host's engines run under (jemalloc where installed, MEBP_ALLOCATOR), "
        "whose heap the memory figures count"))
    measured_at: str | None = Field(description="UTC, ISO 8601")
    load_average: list[float | None] = Field(
        description="the 1-minute load average before and after the measurement")
    spread: dict[str, float] = Field(
        description="per kind of figure, the upper quartile of its repeats over the lower")
    max_spread: float | None
    steady: bool = Field(description=(
        "its repeats agreed within spread_bound; false on a busy host: its time figures are "
        "provisional until a steadier measurement replaces it (memory figures are not "
        "affected)"))
    spread_bound: float
    time_correction: dict[str, dict] = Field(default_factory=dict, description=(
        "per matmul dtype, what measured runs on this host say of its step-time predictions: "
        "the median ratio of measured to modelled step time over its latest runs (factor, "
        "runs), and how many of them timed their parts (timed_runs), which correct each "
        "configuration's parts from the runs most like it; empty before any run"))


class RecommendationPublic(BaseModel):
    method: str
    configuration: str
    why: str


class PlanPublic(BaseModel):
    method: str = Field(description="the training method planned: mebp, mezo or backprop")
    workload: dict
    budget_mb: float | None
    margin: float
    largest_fitting_peak_mb: float | None = Field(default=None, description=(
        "the budget less the margin, budget / (1 + margin): a configuration whose predicted "
        "peak is above it does not fit"))
    calibration: CalibrationPublic | None = None
    device: DevicePublic | None
    auto: str | None = Field(description=(
        "the fastest configuration that fits (what a job with config auto runs)"))
    time_tolerance: float = Field(default=DEFAULT_TIME_TOLERANCE, description=(
        "the request's: how much slower than auto the recommendation may be"))
    recommendation: RecommendationPublic | None = Field(default=None, description=(
        "the smallest configuration that fits whose step time is within time_tolerance of "
        "auto's, and why; null when nothing fits"))
    feasible: bool | None
    smallest_budget_mb: int
    dominant_component: str
    device_mezo_step_time_s_estimate: float | None = Field(default=None, description=(
        "MeZO's step on the device for the same workload: two forwards, no backward"))
    ranked_by: Literal["device", "host"] = Field(default="host", description=(
        "what the front and auto rank by: the device's estimated step time when a device "
        "with rates is given, else this host's predicted one"))
    pareto: list[str]
    configurations: list[ConfigurationPublic]


class MethodPlansPublic(BaseModel):
    """Every method's plan of one model, setting and budget, side by side."""

    method: Literal["all"]
    plans: dict[str, PlanPublic] = Field(description="method -> its plan")
    skipped: dict[str, str] = Field(description="method -> why the setting does not apply")
    recommendation: RecommendationPublic | None = Field(description=(
        "the smallest exact configuration that fits within time_tolerance of the fastest "
        "exact one (MeZO's recommendation only when nothing else fits); per step: a "
        "comparison measures time to a loss"))
