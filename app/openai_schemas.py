"""The OpenAI-compatible surface's bodies: OpenAI's objects (file, fine_tuning.job, its events
and checkpoints, list) as views of mebp's own rows, each with mebp's fields beside OpenAI's,
and the job request: mebp's ``JobCreate``, taking OpenAI's ``method`` object too."""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from app.api.errors import invalid
from app.api.request_model import RequestModel
from app.job_schemas import JobCreate, JobProgress
from app.training_schemas import Hyperparameters
from mebp_core import config as core

Item = TypeVar("Item")
UnixSeconds = int


class OpenAIList(BaseModel, Generic[Item]):
    object: Literal["list"] = "list"
    data: list[Item]
    has_more: bool = Field(description="more follow: ask again with after=<the last id>")


class FileObject(BaseModel):
    """A dataset, as OpenAI's file."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: UnixSeconds
    filename: str
    purpose: Literal["fine-tune"] = "fine-tune"
    status: Literal["processed"] = Field(default="processed", description=(
        "always: an upload is checked whole before it is kept"))
    rows: int
    sha256: str


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class SupervisedSettings(RequestModel):
    hyperparameters: Hyperparameters | None = None


class SupervisedMethod(RequestModel):
    """OpenAI's ``method`` object: supervised fine-tuning, which is mebp's default method."""

    type: Literal["supervised"]
    supervised: SupervisedSettings | None = None


class FineTuningJobCreate(JobCreate):
    """``JobCreate``: OpenAI's fields by their names, mebp's own (``device``,
    ``memory_budget_mb``, ``config``, ``allow_infeasible``) as extra keys (the SDK's
    ``extra_body``)."""

    method: core.Method | SupervisedMethod = Field(default="mebp", description=(
        'mebp, mezo or backprop; or OpenAI\'s {"type": "supervised"} (mebp), its '
        "supervised.hyperparameters being mebp's hyperparameters"))
    suffix: str | None = Field(default=None, description="refused: an adapter is named "
                               "by its id")
    integrations: list | None = Field(default=None, description="refused: none are offered")

    def job_create(self) -> JobCreate:
        """The same request as mebp's own routes take it; a 422 for what mebp does not do."""
        for name in ("suffix", "integrations"):
            if getattr(self, name) is not None:
                raise invalid(name, f"not supported: {self.model_fields[name].description}",
                              getattr(self, name))
        fields = self.model_dump(by_alias=True, exclude_unset=True,
                                 exclude={"method", "suffix", "integrations"})
        method = self.method
        if isinstance(method, SupervisedMethod):
            given = None if method.supervised is None else method.supervised.hyperparameters
            if given is not None:
                if "hyperparameters" in fields:
                    raise invalid(("method", "supervised", "hyperparameters"), "give the "
                                  "hyperparameters once: here or in hyperparameters")
                fields["hyperparameters"] = given.model_dump(by_alias=True,
                                                             exclude_unset=True)
            method = "mebp"
        return JobCreate.model_validate({**fields, "method": method})


class JobErrorObject(BaseModel):
    code: str
    message: str
    param: str | None = None


class MethodObject(BaseModel):
    type: Literal["supervised"] = "supervised"
    name: core.Method = Field(description="mebp's training method")


FineTuningStatus = Literal["validating_files", "queued", "running", "succeeded", "failed",
                           "cancelled"]


class FineTuningJob(BaseModel):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    model: str
    created_at: UnixSeconds
    finished_at: UnixSeconds | None
    status: FineTuningStatus
    training_file: str
    validation_file: str | None
    hyperparameters: dict = Field(description="mebp's hyperparameters the job runs with")
    fine_tuned_model: str | None = Field(description="the adapter's id once it succeeded")
    error: JobErrorObject | None
    trained_tokens: int | None = Field(default=None, description="null: not counted")
    result_files: list[str] = Field(default_factory=list)
    organization_id: str = Field(description="the tenant")
    seed: int
    estimated_finish: UnixSeconds | None = None
    integrations: list | None = None
    metadata: dict
    method: MethodObject
    device: str | None
    memory_budget_mb: float | None
    config: dict = Field(description="the full training configuration, knobs included")
    progress: JobProgress


class FineTuningJobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: UnixSeconds
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message"] = Field(default="message", description=(
        "per-step metrics are in GET /v1/jobs/{id}/metrics and each checkpoint's metrics"))
    data: dict


class CheckpointMetrics(BaseModel):
    step: int
    train_loss: float | None
    valid_loss: float | None = Field(description=(
        "when the job validated at this step (every eval_every steps and the last)"))


class FineTuningJobCheckpoint(BaseModel):
    """An adapter the job kept at a checkpoint step (``fine_tuned_model_checkpoint``: its id,
    downloaded with GET /v1/jobs/{job}/checkpoints/{id}/adapter)."""

    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: UnixSeconds
    fine_tuned_model_checkpoint: str
    step_number: int
    metrics: CheckpointMetrics
    fine_tuning_job_id: str
    sha256: str
    bytes: int
