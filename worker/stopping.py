"""A worker told to stop (SIGTERM or SIGINT: `mebp serve` stopping, systemd, `docker stop`,
Ctrl+C) gives its job back instead of finishing it: the engine is asked to stop after its
step (it then saves a checkpoint), killed if it has not within ``ENGINE_STOP_S`` (the job
then resumes from its last checkpoint), and the job goes back to the queue, where the next
attempt, here or on another worker, resumes it.

The worker process (RQ's) passes its signal on to the horse running the job
(``worker.main.ServiceWorker``); the horse's runner (``worker.runner``) does the rest.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import update
from sqlmodel import Session

from service.crud import add_event
from service.models import Job
from worker.child import EXIT_STORAGE_FULL
from worker.engine_files import read_result

if TYPE_CHECKING:
    from worker.warm_engine import EngineProcess

# the engine's stop, within the 10 s systemd and `docker stop` give before SIGKILL: what is
# left is for recording the job, the worker's exit and the embedded Redis's
ENGINE_STOP_S = 6.0


class StopSignal:
    """SIGTERM and SIGINT, noted: the runner polls ``is_set``. Every signal after the first
    is noted too (it never kills the horse, whose job would then wait for the reconciler to
    notice its heartbeat went stale)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.name = ""

    def install(self) -> StopSignal:
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, frame: object) -> None:
        self.name = self.name or signal.Signals(number).name
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


class EngineStop:
    """Asks the engine to stop after its step (it keeps its adapter and checkpoint), for a
    cancel or the worker's stop, once: a second SIGTERM would end it without them. Kills it
    once the worker's stop has waited ENGINE_STOP_S."""

    def __init__(self, stop: StopSignal) -> None:
        self.stop = stop
        self.asked = False
        self.deadline: float | None = None

    def act(self, child: EngineProcess, cancel_requested: bool) -> str | None:
        """Called as the engine runs; what to log when it was asked now."""
        if self.stop.is_set() and self.deadline is None:
            self.deadline = time.monotonic() + ENGINE_STOP_S
        if self.deadline is not None and time.monotonic() > self.deadline:
            child.kill()  # its step outlasted the stop: resumed from its last checkpoint
        if self.asked or not (cancel_requested or self.deadline is not None):
            return None
        child.send_signal(signal.SIGTERM)
        self.asked = True
        if self.deadline is None:
            return "stopping after the current step"
        return (f"the worker is stopping ({self.stop.name}): the engine saves a checkpoint "
                "after its step, and the job goes back to the queue")


def checkpoint_step(checkpoint_dir: Path) -> int:
    """The step of the checkpoint a job's attempts left, 0 if none."""
    state = checkpoint_dir / "state.json"
    return json.loads(state.read_text())["step"] if state.is_file() else 0


def ended_by_itself(job_dir: Path, cancel_requested: bool, returncode: int,
                    oom_killed: bool) -> bool:
    """Whether the engine reached an end of the job's own (done, failed, cancelled by the
    user, over its cap, out of storage) rather than the stop its worker asked for."""
    result = read_result(job_dir)
    if result is not None and (result.status != "cancelled" or cancel_requested):
        return True
    return oom_killed or returncode == EXIT_STORAGE_FULL


def give_back(session: Session, job_id: str, worker: str, why: str, step: int) -> bool:
    """Re-queue the job ``worker`` runs, to resume from the checkpoint at ``step``; False if
    it was no longer that worker's. The reconciler puts its message back on the queue."""
    moved = session.exec(update(Job).where(Job.id == job_id, Job.status == "running",
                                           Job.worker == worker).values(status="queued"))
    if moved.rowcount == 1:
        where = f"the checkpoint at step {step}" if step else "its start"
        add_event(session, job_id=job_id, kind="status",
                  message=f"re-queued: its worker stopped ({why}); the next attempt resumes "
                          f"from {where}",
                  data={"status": "queued", "stopped": worker, "checkpoint_step": step})
    session.commit()
    return moved.rowcount == 1
