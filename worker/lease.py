"""A worker's hold on a job: claimed atomically (a job id delivered twice runs once), then
kept alive by a heartbeat the reconciler watches. A job whose heartbeat goes stale is
re-queued, and its next attempt resumes from the last checkpoint.

A delivered id means "a worker is free": the worker claims the job it is fairest to run next
(``service.fairness``), which may be another one; the delivered job keeps its place and the
reconciler gives it a message again."""

from __future__ import annotations

import os
import socket
import threading

from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import aliased
from sqlmodel import Session

from service.crud import add_event
from service.fairness import next_tenant, oldest_queued
from service.models import Job, utc_now

CLAIM_TRIES = 10  # another worker took the job chosen, or it was cancelled: choose again
CLAIM_LOCK = 0x6D656270_636C6169  # PostgreSQL advisory lock serializing claims ("mebpclai")


def worker_name() -> str:
    # runs in the horse RQ forked for the job; its parent is the worker process
    return f"{socket.gethostname()}:{os.getppid()}"


def claim_job(session: Session, worker: str, *, max_running_per_tenant: int) -> Job | None:
    """Move the fairest queued job to running for ``worker``; None when no tenant with queued
    jobs is under its running limit. Concurrent claims never run a job twice nor a tenant
    past its limit: the update re-checks both, and on PostgreSQL claims take turns."""
    for _ in range(CLAIM_TRIES):
        _take_claim_turn(session)
        tenant = next_tenant(session, max_running_per_tenant)
        job = None if tenant is None else oldest_queued(session, tenant)
        if job is None:
            session.rollback()
            return None
        if _claim(session, job.id, tenant, worker, max_running_per_tenant):
            session.refresh(job)
            add_event(session, job_id=job.id, kind="status",
                      message=f"started (attempt {job.attempts})",
                      data={"status": "running", "worker": worker, "attempt": job.attempts})
            session.commit()
            return job
        session.rollback()
    return None


def _take_claim_turn(session: Session) -> None:
    # SQLite runs one write at a time (the update below re-checks under its lock); on
    # PostgreSQL two claims reading at once could both see a tenant under its limit
    if session.get_bind().dialect.name == "postgresql":
        session.connection().execute(text("select pg_advisory_xact_lock(:key)"),
                                     {"key": CLAIM_LOCK})


def _claim(session: Session, job_id: str, tenant: str, worker: str, max_running: int) -> bool:
    other = aliased(Job)
    running = select(func.count()).select_from(other).where(
        other.tenant == tenant, other.status == "running").scalar_subquery()
    now = utc_now()
    claimed = session.exec(
        update(Job).where(Job.id == job_id, Job.status == "queued", running < max_running)
        .values(status="running", worker=worker, heartbeat_at=now, attempts=Job.attempts + 1,
                started_at=func.coalesce(Job.started_at, now))
        .execution_options(synchronize_session=False))  # the caller refreshes the job
    return claimed.rowcount == 1


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
            if not self.beat():
                return

    def beat(self) -> bool:
        """Refresh the heartbeat once; False (and ``lost`` set) when the job is no longer
        this worker's. A database away for now counts as a beat missed, not a loss."""
        try:
            with Session(self.engine) as session:
                beat = session.exec(update(Job).where(Job.id == self.job_id,
                                                      Job.status == "running",
                                                      Job.worker == self.worker)
                                    .values(heartbeat_at=utc_now()))
                session.commit()
        except SQLAlchemyError:
            return True
        if beat.rowcount == 0:  # finished, or taken from us
            self.lost.set()
            return False
        return True
