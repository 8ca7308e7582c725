"""Job bodies: the job a request creates, its status and progress, its events and metrics."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.api.request_model import RequestModel
from app.common_schemas import Metadata, Name, WebhookUrl
from app.training_schemas import EngineKnobs, Hyperparameters
from mebp_core import config as core
from service.job_plan import JobPlan


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
    webhook_url: WebhookUrl | None = None


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
    device_step_time_s_estimate: float | None = Field(default=None, description=(
        "the estimated seconds per step on the job's device (the profile named by device, "
        "GET /v1/devices/{device}) for the configuration the job runs: the plan's count of "
        "a step's work priced at that profile's rates, not this host's calibration; null "
        "without a device with rates"))
    device_time_s_estimate: float | None = Field(default=None, description=(
        "the estimated seconds on the device for the whole job: total_steps times "
        "device_step_time_s_estimate"))


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
    webhook_url: str | None = Field(default=None, description=(
        "where its status moves and checkpoints are POSTed"))
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
