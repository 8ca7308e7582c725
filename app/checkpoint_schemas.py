"""A job's kept checkpoints as ``GET /v1/jobs/{id}/checkpoints`` shows them (the OpenAI face's
shape is ``app.openai_schemas.FineTuningJobCheckpoint``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from service.adapter_downloads import FORMATS
from service.models import JobCheckpoint


class CheckpointPublic(BaseModel):
    id: str
    job_id: str
    step: int
    train_loss: float | None = Field(description="the training loss of its step")
    valid_loss: float | None = Field(description=(
        "the validation loss at its step, if the job validated then (every eval_every "
        "steps and the last), else null"))
    sha256: str = Field(description="of its PEFT zip")
    bytes: int = Field(description="of its adapter's files")
    created_at: datetime
    downloads: dict[str, str] = Field(description="its adapter in each format: the URL")


class CheckpointsPublic(BaseModel):
    data: list[CheckpointPublic] = Field(description="newest first")
    has_more: bool = Field(description="more follow: ask again with after=<the last id>")


def checkpoint_public(checkpoint: JobCheckpoint) -> CheckpointPublic:
    url = f"/v1/jobs/{checkpoint.job_id}/checkpoints/{checkpoint.id}/adapter"
    return CheckpointPublic(
        id=checkpoint.id, job_id=checkpoint.job_id, step=checkpoint.step,
        train_loss=checkpoint.train_loss, valid_loss=checkpoint.valid_loss,
        sha256=checkpoint.sha256, bytes=checkpoint.bytes, created_at=checkpoint.created_at,
        downloads={fmt: f"{url}?format={fmt}" for fmt in FORMATS})
