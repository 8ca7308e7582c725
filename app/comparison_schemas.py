"""Comparison request and response bodies: methods side by side on one model, dataset and
phone, each at a few learning rates, as validation loss against simulated on-device time."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, create_model

from app.api.request_model import RequestModel
from app.common_schemas import Metadata, Name
from app.job_schemas import JobError
from app.training_schemas import Hyperparameters
from mebp_core.config import MAX_STEPS, Method, TrainConfig
from service.comparison_spec import MethodVerdict

MAX_LEARNING_RATES = 8
# SGD on LoRA (the default optimizer): MeZO's estimate of the gradient is noisy, so it
# takes smaller steps (the MeZO paper's range); override per method
DEFAULT_LEARNING_RATES: dict[str, list[float]] = {
    "mebp": [1e-3, 1e-2], "mezo": [1e-4, 1e-3], "backprop": [1e-3, 1e-2]}
DEFAULT_METHODS: list[Method] = ["mebp", "mezo"]
# what a comparison sets for each of its jobs itself: every other hyperparameter is shared
OWN_HYPERPARAMETERS = ("steps", "lr", "eval_every")

LearningRate = Annotated[float, *TrainConfig.model_fields["lr"].metadata]
LearningRateList = Annotated[list[LearningRate], Field(
    min_length=1, max_length=MAX_LEARNING_RATES,
    description=f"1 to {MAX_LEARNING_RATES} learning rates, one job each")]


class SharedHyperparameters(create_model(
        "SharedHyperparameters", __base__=RequestModel,
        **{name: (field.annotation, copy.copy(field))
           for name, field in Hyperparameters.model_fields.items()
           if name not in OWN_HYPERPARAMETERS})):
    """The jobs' hyperparameters but the steps, the learning rate and ``eval_every``, which
    the comparison sets per job: one setting for every method."""


class LearningRates(RequestModel):
    """Per method, the learning rates to try (default: ``DEFAULT_LEARNING_RATES``)."""

    mebp: LearningRateList | None = None
    mezo: LearningRateList | None = None
    backprop: LearningRateList | None = None


class ComparisonCreate(RequestModel):
    """Methods side by side on the user's own data and phone: one normal job per method and
    learning rate, each planned (``config: "auto"``) and capped at the device's budget, all
    scored on the validation file every ``eval_every`` steps."""

    model: Name = Field(examples=["preset:qwen2.5-0.5b"])
    training_file: Name = Field(description="a dataset id from POST /v1/datasets")
    validation_file: Name = Field(description="a dataset id: the loss every curve shows")
    device: Name = Field(description="a device profile id: the comparison is in its time "
                         "and under its budget", examples=["iphone-15-pro-max"])
    memory_budget_mb: float | None = Field(default=None, gt=0, le=1 << 20,
                                           description="overrides the device's budget")
    methods: list[Method] = Field(default_factory=lambda: list(DEFAULT_METHODS),
                                  min_length=1, max_length=3)
    learning_rates: LearningRates = LearningRates()
    max_steps: int | None = Field(default=None, ge=1, le=MAX_STEPS, description=(
        "every job trains this many steps (give this or max_device_time_s)"))
    max_device_time_s: float | None = Field(default=None, gt=0, le=1e9, description=(
        "simulated on-device seconds per job: each trains this over its plan's estimated "
        "seconds per step on the device, at least 1 and at most the steps a job may take"))
    eval_every: int | None = Field(default=None, ge=1, le=MAX_STEPS, description=(
        "steps between validations (default: a tenth of each job's steps)"))
    hyperparameters: SharedHyperparameters = SharedHyperparameters()
    seed: int = copy.copy(TrainConfig.model_fields["seed"])
    metadata: Metadata = Field(default_factory=dict)
    allow_infeasible: bool = Field(default=False, description=(
        "also run the methods the planner predicts will not fit (the kernel cap decides)"))

    def rates_of(self, method: Method) -> list[float]:
        return getattr(self.learning_rates, method) or DEFAULT_LEARNING_RATES[method]


class CurvePoint(BaseModel):
    step: int
    val_loss: float
    device_time_s: float | None = Field(description=(
        "simulated on-device seconds: the plan's estimated seconds per step on the device "
        "x step; null where the plan has no device estimate"))
    host_time_s: float | None = Field(description="seconds on this host since the job "
                                      "started")


class ComparisonRun(BaseModel):
    """One job of the comparison: a method at one learning rate."""

    job_id: str
    method: Method
    learning_rate: float
    status: str
    error: JobError | None
    step: int
    total_steps: int
    predicted_peak_mb: float | None
    measured_peak_mb: float | None = Field(description=(
        "anonymous + shared memory at its peak, as the kernel counts it"))
    device_step_time_s_estimate: float | None
    best_val_loss: float | None
    final_val_loss: float | None
    curve: list[CurvePoint]


class MethodOutcome(MethodVerdict):
    """A method's runs, and the learning rate that reached the lowest validation loss."""

    measured_peak_mb: float | None = Field(description="the highest of its jobs' peaks")
    best_learning_rate: float | None
    best_job_id: str | None
    best_val_loss: float | None
    best_curve: list[CurvePoint]
    runs: list[ComparisonRun]


ComparisonStatus = Literal["queued", "running", "done"]


class ComparisonPublic(BaseModel):
    id: str
    object: Literal["comparison"] = "comparison"
    status: ComparisonStatus = Field(description="done once every job has ended")
    model: str
    device: str
    memory_budget_mb: float
    training_file: str
    validation_file: str
    max_steps: int | None
    max_device_time_s: float | None
    summary: str = Field(description="what the measurements say, in one or two sentences")
    methods: list[MethodOutcome]
    metadata: dict
    created_at: datetime


class ComparisonsPublic(BaseModel):
    data: list[ComparisonPublic]
    count: int
