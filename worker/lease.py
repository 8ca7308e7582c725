"""A worker's hold on a job: claimed atomically (a job id delivered twice runs once), then
kept alive by a heartbeat the reconciler watches. A job whose heartbeat goes stale is
re-queued, and its next attempt resumes from the last checkpoint."""

from __future__ import annotations

import os
import socket
import threading

from sqlalchemy import Engine, func, update
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from app.crud import add_event
from app.models import Job, utc_now


def worker_name() -> str:
    # runs in the horse RQ forked for the job; its parent is the worker process
    return f"{socket.gethostname()}:{os.getppid()}"


def claim_job(session: Session, job_id: str, worker: str) -> Job | None:
    """Move a queued job to running for ``worker``; None when it is not queued (cancelled,
    finished, or claimed by another worker from a duplicate delivery)."""
    now = utc_now()
    claimed = session.exec(
        update(Job).where(Job.id == job_id, Job.status == "queued")
        .values(status="running", worker=worker, heartbeat_at=now, attempts=Job.attempts + 1,
                started_at=func.coalesce(Job.started_at, now)))
    if claimed.rowcount != 1:
        session.rollback()
        return None
    job = session.get(Job, job_id)
    session.refresh(job)
    add_event(session, job_id=job_id, kind="status", message=f"started (attempt {job.attempts})",
              data={"status": "running", "worker": worker, "attempt": job.attempts})
    session.commit()
    return job


class Heartbeat:
    """Refreshes the job's heartbeat on a thread while the worker holds it. ``lost`` is set
    when the job is no longer this worker's (the reconciler re-queued it after beats went
    missing): the worker must then stop it and write nothing."""

    def __init__(self, engine: Engine, job_id: str, worker: str, interval_s: float) -> None:
        self.engine, self.job_id, self.worker, self.interval_s = engine, job_id, worker, interval_s
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mebp-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with Session(self.engine) as session:
                    beat = session.exec(update(Job).where(Job.id == self.job_id,
                                                          Job.status == "running",
                                                          Job.worker == self.worker)
                                        .values(heartbeat_at=utc_now()))
                    session.commit()
            except SQLAlchemyError:  # the database is away: the next beat tries again
                continue
            if beat.rowcount == 0:  # finished, or taken from us
                self.lost.set()
                return
