"""A job row as the API and the pages show it."""

from __future__ import annotations

from app.job_schemas import JobError, JobProgress, JobPublic
from mebp_core.units import MB
from service.models import Adapter, Job


def job_public(job: Job, adapter: Adapter | None) -> JobPublic:
    planned = job.planned()
    device_step_s = None if job.plan is None else job.plan.device_step_time_s_estimate
    error = None if job.error_code is None else JobError(
        code=job.error_code, message=job.error_message or "", detail=job.error_detail)
    return JobPublic(
        id=job.id, status=job.status, model=job.model, device=job.device_id,
        memory_budget_mb=_mb(job.memory_budget_bytes), method=job.train_config().method,
        config=job.config, plan=job.plan, training_file=job.training_file,
        validation_file=job.validation_file, fleet_id=job.fleet_id,
        enforcement=job.enforcement, attempts=job.attempts, worker=job.worker,
        progress=JobProgress(step=job.step, total_steps=job.total_steps, loss=job.last_loss,
                             peak_memory_mb=_mb(job.peak_memory_bytes),
                             peak_anon_mb=_mb(job.peak_anon_bytes),
                             cgroup_peak_usage_mb=_mb(job.cgroup_peak_bytes),
                             step_time_s=job.step_time_s,
                             predicted_peak_mb=None if planned is None
                             else planned.predicted_peak_mb,
                             predicted_step_time_s=None if planned is None
                             else planned.predicted_step_time_s,
                             device_step_time_s_estimate=device_step_s,
                             device_time_s_estimate=None if device_step_s is None
                             else round(job.total_steps * device_step_s, 1)),
        error=error,
        adapter=None if adapter is None else {
            "id": adapter.id, "sha256": adapter.sha256, "bytes": adapter.bytes,
            "formats": ["peft", "mlx", "gguf"]},
        metadata=job.metadata_, webhook_url=job.webhook_url, created_at=job.created_at,
        started_at=job.started_at, finished_at=job.finished_at)


def _mb(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / MB, 1)

