"""The job's plan made again on the host that runs it: its calibration, its thread count and
its CPU's bf16 path decide the configuration (the API planned on its own host to answer the
request). The thread count is the worker's setting, else the cores free as the attempt
starts: threads on cores other processes keep busy slow every step several times over.
Each attempt plans for its own worker; knobs never change the math, so a resumed attempt
may take other knobs than the one that wrote the checkpoint."""

from __future__ import annotations

import os

from sqlmodel import Session

from mebp_core.cache import default_cache_dir
from mebp_core.config import TrainConfig
from mebp_core.cpu import idle_cores, threads_for_idle_cores
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import load_calibration
from mebp_core.plan.on_host import plan_job_run
from service.crud import add_event
from service.devices import find_device
from service.models import Job
from service.settings import Settings


def plan_on_this_worker(session: Session, job: Job, source: str, settings: Settings,
                        worker: str) -> TrainConfig:
    """The config this attempt runs (its threads, and for a planned job the configuration
    this host predicts fastest within the budget at those threads); the job's config and
    plan are updated to match, with an event when the configuration differs from the API's.
    A job planned with this very calibration (the API on the same host) is not planned
    again."""
    config = job.train_config()
    threads = attempt_threads(session, job, settings)
    here = config.model_copy(update={"knobs": config.knobs.model_copy(
        update={"threads": threads})})
    job.config = here.model_dump(mode="json")
    session.add(job)
    planned = job.plan or {}
    if not planned.get("planned"):  # another method: its knobs are as requested
        return here
    if _same_host(planned.get("calibration"), settings, threads):  # this host's own plan
        return here
    device = None if job.device_id is None else find_device(session, job.device_id)
    here, summary, _ = plan_job_run(
        load_architecture(source), here, budget_bytes=job.memory_budget_bytes, device=device,
        chosen_by=planned.get("chosen_by", "auto"), cache_dir=settings.cache_dir)
    summary["planned_by"] = worker
    chosen_id = summary["configuration"]
    if chosen_id != planned.get("configuration"):
        add_event(session, job_id=job.id, kind="log",
                  message=f"planned on {worker}: {chosen_id} (predicted "
                  f"{summary['predicted_peak_mb']:.0f} MB, {summary['predicted_step_time_s']:.2f}"
                  f" s/step) instead of {planned.get('configuration')}",
                  data={"configuration": chosen_id,
                        "previous_configuration": planned.get("configuration")})
    job.config = here.model_dump(mode="json")
    job.plan = summary
    return here


def attempt_threads(session: Session, job: Job, settings: Settings) -> int:
    """The worker's thread setting, else one thread per core free as the attempt starts
    (with an event saying how many were)."""
    if settings.threads:
        return settings.threads
    idle = idle_cores()
    threads = threads_for_idle_cores(idle)
    if idle is not None:
        add_event(session, job_id=job.id, kind="log",
                  message=f"running on {threads} thread{'s' * (threads > 1)}: {idle:.1f} of "
                  f"{os.cpu_count()} cores idle as it starts",
                  data={"threads": threads, "idle_cores": round(idle, 2)})
    return threads



CALIBRATION_IDENTITY = ("host", "threads", "torch", "kernel", "measured_at")


def _same_host(calibration: dict | None, settings: Settings, threads: int) -> bool:
    """Whether ``calibration`` (a plan's) is this worker's own, at ``threads``."""
    if not calibration:
        return False
    here = load_calibration(settings.cache_dir or default_cache_dir(), threads)
    mine = here.provenance()
    return all(calibration.get(key) == mine[key] for key in CALIBRATION_IDENTITY)
