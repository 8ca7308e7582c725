"""Request and response bodies, one model per shape."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    create_model,
)
from pydantic.fields import FieldInfo

from app.api.request_model import RequestModel
from mebp_core import config as core
from mebp_core.plan.workload import PLAN_QUERY_FIELDS
from service.job_plan import JobPlan

Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=1024)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(
    max_length=32, description="up to 32 string pairs (keys up to 64 characters, values up "
    "to 1024)")]
LoraTargets = Annotated[str, StringConstraints(max_length=256)] | Annotated[
    list[Annotated[str, StringConstraints(min_length=1, max_length=64)]], Field(max_length=16)]


class ErrorMessage(BaseModel):
    """Every error but a 422: what went wrong, in words."""

    detail: str


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


class EngineKnobs(RequestModel, core.EngineKnobs):
    """The engine's knobs as a request carries them: finite numbers, no booleans for
    counts."""


# TrainConfig fields whose public name is not the CLI's (``--lr`` is ``learning_rate``)
PUBLIC_NAMES = {"lr": "learning_rate"}


def _config_fields(names, **overrides) -> dict:
    """``TrainConfig``'s own fields (type, bounds, default, description), for a request
    body, under their public names: one definition of each setting."""
    fields = core.TrainConfig.model_fields

    def public(name: str) -> FieldInfo:
        if name not in PUBLIC_NAMES:
            return copy.copy(fields[name])
        return FieldInfo.merge_field_infos(fields[name], Field(alias=PUBLIC_NAMES[name]))

    return {**{name: (fields[name].annotation, public(name)) for name in names}, **overrides}


# TrainConfig fields a job request carries elsewhere or not at all: every other field is a
# hyperparameter, so a field added to TrainConfig is one with no other edit
_NOT_HYPERPARAMETERS = ("schema_version", "knobs", "method", "seed",
                        "validation_fraction", "skip_malformed", "data_start_batch")


class WorkloadFields(create_model(
        "Workload", __base__=RequestModel, **_config_fields(
            PLAN_QUERY_FIELDS, lora_targets=(LoraTargets, Field(default="all", description=(
                "the projections LoRA adapts: all, comma-separated suffixes or a list")))))):
    """What the planner's predictions depend on, besides the model and the knobs."""

    def workload(self) -> dict:
        """These fields alone, as ``TrainConfig`` takes them."""
        return self.model_dump(include=set(PLAN_QUERY_FIELDS))


class PlanCreate(WorkloadFields):
    """A model and a training setting; the planner predicts every trade-off configuration."""

    model: Name = Field(description="preset:NAME or a registered model",
                        examples=["preset:qwen2.5-0.5b"])
    device: Name | None = Field(default=None, description="a device profile id")
    memory_budget_mb: float | None = Field(default=None, gt=0, le=1 << 20,
                                           description="overrides the device's budget")
    margin: float = Field(default=0.10, ge=0, le=1)
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


class PlanPublic(BaseModel):
    method: str = Field(description="the training method planned: mebp, mezo or backprop")
    workload: dict
    budget_mb: float | None
    margin: float
    calibration: CalibrationPublic | None = None
    device: DevicePublic | None
    auto: str | None = Field(description="the fastest configuration that fits")
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


class RecommendationPublic(BaseModel):
    method: str
    configuration: str
    why: str


class MethodPlansPublic(BaseModel):
    """Every method's plan of one model, setting and budget, side by side."""

    method: Literal["all"]
    plans: dict[str, PlanPublic] = Field(description="method -> its plan")
    skipped: dict[str, str] = Field(description="method -> why the setting does not apply")
    recommendation: RecommendationPublic | None = Field(description=(
        "the fastest exact configuration that fits (MeZO only when nothing else fits); "
        "per step: a comparison measures time to a loss"))


class DatasetPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    filename: str
    bytes: int
    rows: int
    sha256: str
    created_at: datetime


class DatasetsPublic(BaseModel):
    data: list[DatasetPublic]
    count: int


class Hyperparameters(create_model(
        "Training", __base__=WorkloadFields, **_config_fields(
            [name for name in core.TrainConfig.model_fields
             if name not in PLAN_QUERY_FIELDS and name not in _NOT_HYPERPARAMETERS],
            checkpoint_every=(int | None, Field(default=None, ge=1, description=(
                "steps between checkpoints, from which a job resumes after losing its "
                "worker (default MEBP_CHECKPOINT_EVERY)")))))):
    """Training settings: ``TrainConfig``'s fields, named as in ``mebp train`` but for
    ``PUBLIC_NAMES`` (``learning_rate`` is ``--lr``)."""


class JobCreate(RequestModel):
    model: Name = Field(description="preset:NAME", examples=["preset:qwen2.5-0.5b"])
    training_file: Name = Field(description="a dataset id from POST /v1/datasets")
    validation_file: Name | None = None
    device: Name | None = Field(default=None, description="a device profile id",
                                examples=["iphone-15-pro-max"])
    memory_budget_mb: float | None = Field(default=None, gt=0, le=1 << 20,
                                           description="overrides the device's budget")
    method: core.Method = "mebp"
    hyperparameters: Hyperparameters = Hyperparameters()
    config: Literal["auto"] | EngineKnobs = Field(
        default="auto", description='"auto" (the fastest configuration predicted to fit) or '
        "explicit trade-off knobs")
    seed: int = copy.copy(core.TrainConfig.model_fields["seed"])
    metadata: Metadata = Field(default_factory=dict)
    allow_infeasible: bool = Field(default=False, description="run even when the planner "
                                   "predicts the budget is too small: the kernel cap decides")


class JobError(BaseModel):
    code: str
    message: str
    detail: dict | None = None


class JobProgress(BaseModel):
    step: int
    total_steps: int
    loss: float | None
    peak_memory_mb: float | None = Field(description=(
        "the job's peak of memory the kernel charges and cannot reclaim: anonymous plus "
        "shared (from its cgroup's counters at each step's end)"))
    peak_anon_mb: float | None = Field(description="its anonymous part alone")
    cgroup_peak_usage_mb: float | None = Field(default=None, description=(
        "the job cgroup's own peak usage, which also counts reclaimable file pages (the "
        "memory-mapped store): an upper bound"))
    predicted_peak_mb: float | None = Field(default=None, description=(
        "what the plan predicted for peak_memory_mb"))
    step_time_s: float | None = Field(default=None, description=(
        "measured: the median of the latest attempt's steps after its first"))
    predicted_step_time_s: float | None = Field(default=None, description=(
        "what the plan predicted for step_time_s on this host (with its correction from "
        "measured runs)"))


JobStatus = Literal["validating", "queued", "running", "succeeded", "failed", "cancelled"]


class JobPublic(BaseModel):
    id: str
    object: Literal["job"] = "job"
    status: JobStatus
    model: str
    device: str | None
    memory_budget_mb: float | None
    method: str
    config: dict = Field(description="the full training configuration, knobs included")
    plan: JobPlan | None = Field(description=(
        "what the planner predicted for the configuration the job runs, beside the smallest "
        "budget that fits"))
    training_file: str
    validation_file: str | None
    fleet_id: str | None
    enforcement: str | None = Field(description="how the budget was enforced: cgroup-v2, "
                                    "cgroup-v1 or rlimit")
    attempts: int = Field(description="runs started: more than one after a lost worker")
    worker: str | None = Field(description="host:pid of the worker that ran it last")
    progress: JobProgress
    error: JobError | None
    adapter: dict | None
    metadata: dict
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    kind: str
    message: str
    data: dict


class MetricPublic(BaseModel):
    step: int
    loss: float | None
    data: dict
    at: datetime


class MetricsPublic(BaseModel):
    """One page of a job's metrics, in step order."""

    data: list[MetricPublic]
    count: int
    next: str | None = Field(None, description="the next page's URL (as the Link header "
                             "rel=\"next\" gives it); null on the last page")


ID_PATTERN = r"^[a-z0-9]+([._-][a-z0-9]+)*$"


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


class ModelCreate(RequestModel):
    name: str = Field(pattern=ID_PATTERN, max_length=64, examples=["my-qwen"])
    path: str = Field(min_length=1, max_length=1024,
                      description="a Hugging Face model directory inside the model roots")


class BaseExporting(BaseModel):
    status: Literal["exporting"] = "exporting"
    detail: str


class ModelPublic(BaseModel):
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
