"""Keeping the queue true to the database, which is the source of truth.

Every few seconds: a running job whose heartbeat went stale has lost its worker (killed,
its machine gone) and is re-queued to resume from its last checkpoint, or fails with
``worker_lost`` after ``max_attempts``; a queued job Redis no longer holds (Redis restarted
empty, or its message was taken by a worker that claimed a fairer job) is enqueued again
while its tenant may start another; a preparing fleet whose preparation Redis no longer
holds is asked again (``service.fleet_recovery``). A job id delivered twice still runs once:
workers claim atomically. A row that no longer validates (``MalformedRowError``) is left out,
logged naming it and why, and the round goes on with the others.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError
from rq.job import Job as RqJob
from rq.queue import Queue
from sqlalchemy import Engine, update
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, select

from service.crud import add_event
from service.fairness import ids_to_enqueue
from service.federation import stalled
from service.fleet_recovery import lost_preparations
from service.json_column import rows_that_load
from service.models import Job, utc_now
from service.queue import enqueue_advance, enqueue_job, enqueue_prepare
from service.settings import Settings

log = logging.getLogger("mebp.reconciler")
# RQ states in which it will still run the job ("started" is not one: the database says
# queued, so whoever started it let go)
WAITING = {"queued", "deferred", "scheduled"}
STARTED = "started"
QUEUED_GRACE_S = 10.0  # a job committed a moment ago is being enqueued by its request


class Reconciler:
    def __init__(self, engine: Engine, queue: Queue, settings: Settings) -> None:
        self.engine, self.queue, self.settings = engine, queue, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mebp-reconciler", daemon=True)

    def start(self) -> Reconciler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.reconcile_interval_s):
            try:
                self.reconcile()
            except (RedisError, SQLAlchemyError) as exc:  # down for now: next round
                log.warning("reconciler: %s", exc)
            except Exception:  # a bug, say: logged every round, the thread lives on
                log.exception("reconciler: this round failed")

    def reconcile(self) -> list[str]:
        """One round; returns the ids it enqueued."""
        with Session(self.engine) as session:
            requeued = self._recover_lost(session)
            missing = ids_to_enqueue(session, self._queued_before(session, QUEUED_GRACE_S),
                                     self._in_redis, self.settings.max_running_jobs_per_tenant)
            fleets = stalled(session, self.settings.advance_grace_s)
            unprepared = lost_preparations(session, self._held, self.settings.advance_grace_s,
                                           self.settings.max_attempts)
        enqueued = list(dict.fromkeys(requeued + missing))
        for job_id in enqueued:
            enqueue_job(self.queue, job_id)
        for fleet_id in fleets:  # a coordinator lost mid-round, or a round nobody trains in
            enqueue_advance(self.queue, fleet_id)
        for fleet_id in unprepared:
            enqueue_prepare(self.queue, fleet_id)
        return enqueued

    def _recover_lost(self, session: Session) -> list[str]:
        stale = utc_now() - timedelta(seconds=self.settings.heartbeat_timeout_s)
        lost = rows_that_load(session, select(Job).where(Job.status == "running",
                                                         Job.heartbeat_at < stale))
        requeued = []
        for job in lost:
            silent = f"its worker {job.worker} sent no heartbeat for " \
                     f"{self.settings.heartbeat_timeout_s:.0f} s"
            if job.cancel_requested:
                outcome, message = "cancelled", f"cancelled: {silent}"
            elif job.attempts >= self.settings.max_attempts:
                outcome, message = "failed", f"{silent}, on attempt {job.attempts} of " \
                                             f"{self.settings.max_attempts}; giving up"
            else:
                outcome, message = "queued", f"re-queued: {silent}; the next attempt " \
                                             f"resumes from the last checkpoint"
            # only if no heartbeat (or end) came in since we looked
            values = {"status": outcome}
            if outcome != "queued":
                values["finished_at"] = utc_now()
            if outcome == "failed":
                values.update(error_code="worker_lost", error_message=message)
            moved = session.exec(update(Job).where(Job.id == job.id, Job.status == "running",
                                                   Job.heartbeat_at < stale).values(**values))
            if moved.rowcount == 1:
                add_event(session, job_id=job.id, kind="status", message=message,
                          data={"status": outcome, "lost": job.worker})
                if outcome == "queued":
                    requeued.append(job.id)
            session.commit()
        return requeued

    def _queued_before(self, session: Session, seconds: float) -> list[Job]:
        cutoff = utc_now() - timedelta(seconds=seconds)
        return rows_that_load(session, select(Job).where(Job.status == "queued",
                                                         Job.created_at < cutoff))

    def _in_redis(self, job_id: str) -> bool:
        try:
            return RqJob.fetch(job_id, connection=self.queue.connection).get_status() in WAITING
        except NoSuchJobError:
            return False

    def _held(self, rq_id: str) -> bool:
        """Whether RQ will still run, or is running, that job: one whose worker died stays
        started until RQ's cleanup sees its heartbeat lapse and fails it."""
        try:
            status = RqJob.fetch(rq_id, connection=self.queue.connection).get_status()
            if status == STARTED:
                self.queue.started_job_registry.cleanup()
                status = RqJob.fetch(rq_id, connection=self.queue.connection).get_status()
        except NoSuchJobError:
            return False
        return status in WAITING or status == STARTED
