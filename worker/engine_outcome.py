"""How a job's engine ended, recorded on the job: its adapter kept (and listed as its last
checkpoint) and its time measured (succeeded or cancelled), or the failure it ended with,
named: over its memory cap (with the kernel's figures and the planner's smallest budget),
out of storage, an error the user can act on, or a crash (with the last lines of its
log)."""

from __future__ import annotations

import signal
from pathlib import Path

from sqlmodel import Session

from mebp_core.cache import default_cache_dir
from mebp_core.lora.peft_files import ADAPTER_FILES
from mebp_core.units import MB
from service.adapter_downloads import adapter_file
from service.crud import add_event, fail_job, set_status
from service.models import Adapter, Job
from service.settings import Settings
from service.storage import new_id
from worker.child import ADAPTER, ENGINE_LOG, EXIT_STORAGE_FULL, KEPT
from worker.engine_files import EngineFinished, EngineRequest, read_result
from worker.kept_checkpoints import record_final, remove_folders
from worker.measured_time import correct_host_time
from worker.memory_cap import MemoryCap


def record_cgroup_peak(job: Job, cap: MemoryCap) -> None:
    """The cgroup's peak of usage, kept as a maximum: the engine restarts the kernel's
    counter each step (its per-step peak) and reports the run's maximum itself."""
    job.cgroup_peak_bytes = max(job.cgroup_peak_bytes or 0, cap.peak_bytes() or 0) or None


def record_outcome(session: Session, job: Job, job_dir: Path, returncode: int,
                   cap: MemoryCap, request: EngineRequest, settings: Settings,
                   decompress_times: list[float | None]) -> None:
    """The job's end, from the engine's result, exit code and the kernel's cap, committed."""
    result = read_result(job_dir)
    # before the session's first write: held across this wait on the correction's lock, a
    # write would stop every other writer of a SQLite database
    said = correct_host_time(job, cache_dir=settings.cache_dir or default_cache_dir(),
                             threads=request.config.knobs.threads,
                             decompress_times=decompress_times) \
        if isinstance(result, EngineFinished) else None
    record_cgroup_peak(job, cap)
    dropped: list[Path] = []
    if isinstance(result, EngineFinished):
        adapter = _keep_adapter(session, job, job_dir)
        if request.keep_checkpoints:  # listed as the job's last checkpoint (a phone keeps none)
            dropped = record_final(session, job.id, adapter, result.steps,
                                   settings.max_checkpoints_per_job)
        message = "succeeded" if result.status == "succeeded" else \
            f"cancelled after step {result.steps}; the adapter so far is kept"
        set_status(session, job, result.status, message,
                   data={"final_loss": result.final_loss})
        if said is not None:
            add_event(session, job_id=job.id, kind="log", message=said[0], data=said[1])
    elif cap.oom_killed() or (result is not None
                              and result.code == "memory_budget_exceeded"):
        if result is not None and result.peak_rss_mb:
            job.peak_memory_bytes = int(result.peak_rss_mb * MB)
        _fail_over_budget(session, job, cap)
    elif returncode == EXIT_STORAGE_FULL:
        fail_job(session, job, "storage_full",
                 f"the storage ran out of space while the engine wrote its files (under "
                 f"{settings.storage_root}); nothing partial is kept")
    elif result is None and job.cancel_requested and returncode == -signal.SIGTERM:
        set_status(session, job, "cancelled", "cancelled before its first step")
    elif result is not None:
        message = result.message.replace(str(request.data), f"dataset {job.training_file}")
        if request.validation_data is not None:
            message = message.replace(str(request.validation_data),
                                      f"dataset {job.validation_file}")
        fail_job(session, job, result.code, message)
    else:
        fail_job(session, job, "engine_crashed",
                 f"the engine exited with code {returncode} and no result; "
                 f"last lines: {_log_tail(job_dir)}")
    session.commit()
    remove_folders(dropped, job_dir / KEPT)


def fail_limit_refused(session: Session, job: Job, cap: MemoryCap) -> None:
    """The kernel refused the job's limit on its engine (cgroup v1's EBUSY): what the engine
    already held, the kernel's count, is over the job's budget."""
    job.peak_memory_bytes = cap.peak_bytes()
    record_cgroup_peak(job, cap)
    _fail_over_budget(session, job, cap)
    session.commit()


def _fail_over_budget(session: Session, job: Job, cap: MemoryCap) -> None:
    cap_mb = job.memory_budget_bytes / MB
    # killed at the cap: the cgroup's usage then is memory it could not reclaim, and
    # the engine's last sampled figure predates the allocation that failed
    peak = max(job.peak_memory_bytes or 0,
               (job.cgroup_peak_bytes or 0) if cap.oom_killed() else 0) or None
    peak_mb = None if peak is None else round(peak / MB, 1)
    planned = job.planned()
    suggestion = None if planned is None else planned.smallest_budget_mb
    message = (f"{'killed by the kernel at' if cap.oom_killed() else 'ran out of'} the "
               f"job's memory cap of {cap_mb:.0f} MB ({cap.mode})"
               + (f"; peak {peak_mb} MB" if peak_mb is not None else "")
               + (f"; the planner's smallest budget that fits is {suggestion} MB"
                  if suggestion else ""))
    fail_job(session, job, "memory_budget_exceeded", message,
             {"cap_mb": round(cap_mb, 1), "peak_mb": peak_mb, "enforcement": cap.mode,
              "step": job.step, "suggested_budget_mb": suggestion,
              "suggested_configuration": None if planned is None
              else planned.smallest_configuration})


def _keep_adapter(session: Session, job: Job, job_dir: Path) -> Adapter:
    adapter = job_dir / ADAPTER
    files = [adapter / name for name in sorted(ADAPTER_FILES)]
    row = Adapter(id=new_id("ad"), job_id=job.id, path=str(adapter),
                  # its PEFT zip, made once here and served from disk
                  sha256=adapter_file(adapter, "peft", None, remake=True).sha256,
                  bytes=sum(f.stat().st_size for f in files))
    session.add(row)
    return row


def _log_tail(job_dir: Path, lines: int = 5) -> str:
    path = job_dir / ENGINE_LOG
    text = path.read_text(errors="replace") if path.is_file() else ""
    return " | ".join(text.strip().splitlines()[-lines:])
