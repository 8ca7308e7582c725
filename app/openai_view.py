"""mebp's rows as the OpenAI-compatible surface shows them (``app.openai_schemas``)."""

from __future__ import annotations

import calendar
from datetime import datetime

from app.job_view import job_public
from app.openai_schemas import (
    CheckpointMetrics,
    FileObject,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobEvent,
    JobErrorObject,
    MethodObject,
)
from app.training_schemas import Hyperparameters
from service.models import Adapter, Dataset, Event, Job, JobCheckpoint

STATUS_NAMES = {"validating": "validating_files"}  # mebp's other statuses are OpenAI's


def unix_seconds(moment: datetime | None) -> int | None:
    """A stored time (naive ones are UTC, as SQLite gives them back) in unix seconds."""
    return None if moment is None else calendar.timegm(moment.utctimetuple())


def file_object(dataset: Dataset) -> FileObject:
    return FileObject(id=dataset.id, bytes=dataset.bytes,
                      created_at=unix_seconds(dataset.created_at), filename=dataset.filename,
                      rows=dataset.rows, sha256=dataset.sha256)


def fine_tuning_job(job: Job, adapter: Adapter | None) -> FineTuningJob:
    public = job_public(job, adapter)
    config = job.train_config()
    return FineTuningJob(
        id=job.id, model=job.model, created_at=unix_seconds(job.created_at),
        finished_at=unix_seconds(job.finished_at),
        status=STATUS_NAMES.get(job.status, job.status), training_file=job.training_file,
        validation_file=job.validation_file, hyperparameters=hyperparameters(job.config),
        fine_tuned_model=adapter.id if adapter is not None and job.status == "succeeded"
        else None,
        error=None if public.error is None else JobErrorObject(code=public.error.code,
                                                               message=public.error.message),
        organization_id=job.tenant, seed=config.seed, metadata=job.metadata_,
        method=MethodObject(name=config.method), device=public.device,
        memory_budget_mb=public.memory_budget_mb, config=job.config, progress=public.progress)


def hyperparameters(config: dict) -> dict:
    """A stored ``TrainConfig`` dump's hyperparameters, named as a request names them."""
    return {field.alias or name: config[name]
            for name, field in Hyperparameters.model_fields.items() if name in config}


def job_event(event: Event) -> FineTuningJobEvent:
    failed = event.kind == "status" and event.data.get("status") == "failed"
    return FineTuningJobEvent(id=str(event.id), created_at=unix_seconds(event.at),
                              level="error" if failed else "warn" if event.kind == "cancel"
                              else "info", message=event.message, data=event.data)


def job_checkpoint(checkpoint: JobCheckpoint) -> FineTuningJobCheckpoint:
    return FineTuningJobCheckpoint(
        id=checkpoint.id, created_at=unix_seconds(checkpoint.created_at),
        fine_tuned_model_checkpoint=checkpoint.id, step_number=checkpoint.step,
        metrics=CheckpointMetrics(step=checkpoint.step, train_loss=checkpoint.train_loss,
                                  valid_loss=checkpoint.valid_loss),
        fine_tuning_job_id=checkpoint.job_id, sha256=checkpoint.sha256,
        bytes=checkpoint.bytes)
