"""A tiny job's steps take milliseconds, quicker than a busy host passes on a signal, a kill
or a poll: a test that acts on a running job holds the job's engine (SIGSTOP) at a step
first, so that what it does always lands on a running job, never after the job's end."""

from __future__ import annotations

import os
import signal
from contextlib import suppress
from pathlib import Path

import psutil
from waiting import poll_until

from service.storage import job_dir
from worker.child import ENGINE_LOG, METRICS


def storage_of(service) -> Path:
    """The storage root of a service the harness started (its data dir beside its log)."""
    return service.output.parent / "data" / "storage"


def engine_of(job: Path) -> psutil.Process | None:
    """The engine running the job of directory ``job``: its output goes to the job's log."""
    log = str(job / ENGINE_LOG)
    for process in psutil.process_iter():
        with suppress(OSError):
            if os.readlink(f"/proc/{process.pid}/fd/1") == log:
                return process
    return None


def steps_written(job: Path) -> int:
    with suppress(FileNotFoundError):
        return sum(1 for line in (job / METRICS).read_bytes().splitlines() if line.strip())
    return 0


def hold_engine(storage: Path, job_id: str, step: int, timeout_s: float = 300
                ) -> psutil.Process:
    """The engine of job ``job_id``, stopped once it has written step ``step``'s metrics
    (within a step or two of it: it is looked for every few milliseconds)."""
    job = job_dir(storage, job_id)
    engine = poll_until(lambda: engine_of(job) if steps_written(job) >= step else None,
                        lambda found: found is not None, timeout_s,
                        lambda found: f"no engine wrote step {step} in {job}",
                        interval_s=0.005)
    engine.suspend()
    return engine


def release(engine: psutil.Process) -> None:
    with suppress(psutil.NoSuchProcess):
        engine.resume()


def sigterm_pending(engine: psutil.Process) -> bool:
    try:
        status = Path(f"/proc/{engine.pid}/status").read_text()
    except FileNotFoundError:  # killed meanwhile
        return True
    pending = [int(line.split()[1], 16) for line in status.splitlines()
               if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (signal.SIGTERM - 1)) for mask in pending)


def release_once_asked_to_stop(engine: psutil.Process, timeout_s: float) -> None:
    """Let the held engine go on once its horse has signalled it to stop."""
    poll_until(lambda: sigterm_pending(engine), bool, timeout_s,
               lambda _: f"the engine {engine.pid} was never asked to stop", interval_s=0.01)
    release(engine)
