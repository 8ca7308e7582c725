"""Base exports as work for the workers, not the API: each is an RQ job on the exports queue
(served by an exports worker of its own, never behind training), carrying everything it
needs: the request, its target's file name and the cache bound, as the API computed them.
One export per target runs at a time: a start claims the target's marker in Redis (SET NX,
its value the RQ job id; the quota is counted only by the start that wins it), and every
run gets an RQ job id of its own, so nothing RQ does to an old run touches a new one. The
worker holds a lease in Redis while it exports; a started export whose lease has lapsed (its
worker was killed) is queued again, without counting against the quota, by the next request
that may start one (an API key, or the job page's form), never by a page only looking. An
export whose horse a stop signal ended is queued again by its worker at once; one the
kernel's OOM killer ended is a failure saying so, not retried blindly. An export that fails
is not retried: its reason is kept in Redis and reported once, and the next start tries
again. What a killed export left half-written is never at the target (service/bases.py
``make_base``)."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from service.bases import (
    BaseExportFailed,
    BaseRequest,
    ExportedBase,
    base_target,
    is_kept,
    open_kept,
)

MAKE_BASE = "worker.base_export.make_base"  # by name: the API never imports the worker
LEASE_S = 10.0  # a started export is lost once its worker has not renewed this long
LEASE_RENEW_S = 2.0
FAILURE_TTL_S = 24 * 3600
MARKER_TTL_S = 7 * 24 * 3600  # a marker no run clears (Redis lost its jobs) lapses at last
HORSE_DIED = "Work-horse terminated"  # how RQ's failed result of a dead horse begins
WAITING = (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED)


def exports_queue_name(queue_name: str) -> str:
    return f"{queue_name}-exports"


def target_id(target_name: str) -> str:
    return hashlib.sha256(target_name.encode()).hexdigest()[:32]


def run_job_id(target_name: str) -> str:
    """A fresh RQ job id for one run of the export of ``target_name``."""
    return f"base-{target_id(target_name)}-{uuid.uuid4().hex[:12]}"


def marker_key(queue_name: str, target_name: str) -> str:
    """Names the run of the target's export queued or running: ``<job id> <queued at>``."""
    return f"{queue_name}:base-export:{target_id(target_name)}"


def lease_key(queue_name: str, job_id: str) -> str:
    return f"{queue_name}:base-export-lease:{job_id}"


def failure_key(queue_name: str, target_name: str) -> str:
    return f"{queue_name}:base-export-failure:{target_id(target_name)}"


def record_failure(connection: redis.Redis, queue_name: str, target_name: str,
                   reason: str) -> None:
    """Keep why the export failed, for the next start to report (once)."""
    connection.set(failure_key(queue_name, target_name), reason, ex=FAILURE_TTL_S)


def marker_value(job_id: str) -> str:
    return f"{job_id} {time.time():.3f}"


# the marker moves from one run to the next only if it still names the old one
_REPLACE = """if redis.call('get', KEYS[1]) == ARGV[1] then
  if ARGV[2] == '' then return redis.call('del', KEYS[1]) end
  return redis.call('set', KEYS[1], ARGV[2], 'EX', ARGV[3]) end
return false"""


def replace_marker(connection: redis.Redis, key: str, old: str, new: str | None) -> bool:
    """Set the marker ``key`` from ``old`` to ``new`` (None: remove it) if it is still
    ``old``; whether it was."""
    return bool(connection.eval(_REPLACE, 1, key, old, new or "", MARKER_TTL_S))


def enqueue_run(queue: Queue, fields: dict, target_name: str, max_cache_bytes: int,
                job_id: str) -> None:
    queue.enqueue_call(MAKE_BASE, args=(fields, target_name, max_cache_bytes), job_id=job_id,
                       timeout=-1, result_ttl=0, failure_ttl=FAILURE_TTL_S)


def requeue_run(job: Job, queue_name: str) -> bool:
    """Queue the export ``job`` was running again under a fresh id (its horse was ended by a
    stop signal: not the export's fault), if its marker still names it; whether it was."""
    fields, target_name, max_cache_bytes = job.args
    key = marker_key(queue_name, target_name)
    old = job.connection.get(key)
    if old is None or old.decode().split()[0] != job.id:
        return False
    job_id = run_job_id(target_name)
    if not replace_marker(job.connection, key, old.decode(), marker_value(job_id)):
        return False
    enqueue_run(Queue(exports_queue_name(queue_name), connection=job.connection), fields,
                target_name, max_cache_bytes, job_id)
    return True


def end_run(connection: redis.Redis, queue_name: str, target_name: str, job_id: str) -> None:
    """Clear the target's marker if it names run ``job_id`` (ended: made, or failed)."""
    key = marker_key(queue_name, target_name)
    old = connection.get(key)
    if old is not None and old.decode().split()[0] == job_id:
        replace_marker(connection, key, old.decode(), None)


@contextmanager
def holding_lease(connection: redis.Redis, key: str) -> Iterator[None]:
    """Hold ``key`` (renewed every LEASE_RENEW_S, lapsing LEASE_S after the holder dies),
    its value the holder: ``host:pid``."""
    done = threading.Event()
    holder = f"{socket.gethostname()}:{os.getpid()}"

    def renew() -> None:
        while True:
            try:
                connection.set(key, holder, px=int(LEASE_S * 1000))
            except redis.RedisError:  # Redis away for a moment: the next renewal tries
                pass
            if done.wait(LEASE_RENEW_S):
                return
    thread = threading.Thread(target=renew, daemon=True, name="mebp-export-lease")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        with suppress(redis.RedisError):  # Redis away: the lease lapses by itself
            connection.delete(key)


class BaseExports:
    """The API's view of the exports: kept files under the storage root, exports queued or
    running on the workers, and the last attempt's failure, reported once."""

    def __init__(self, connection: redis.Redis, queue_name: str, storage_root: Path,
                 cache_dir: Path, max_cache_bytes: int) -> None:
        self.connection, self.queue_name = connection, queue_name
        self.storage_root, self.cache_dir = storage_root, cache_dir
        self.max_cache_bytes = max_cache_bytes
        self.queue = Queue(exports_queue_name(queue_name), connection=connection)

    def target(self, request: BaseRequest) -> Path:
        return base_target(request, self.storage_root, self.cache_dir)

    def open(self, request: BaseRequest) -> ExportedBase | None:
        return open_kept(request, self.target(request))

    def is_kept(self, request: BaseRequest) -> bool:
        return is_kept(self.target(request))

    def kept_bytes(self, request: BaseRequest) -> int | None:
        """The kept export's size, or None if it is not made."""
        path = self.target(request)
        try:
            return path.stat().st_size if is_kept(path) else None
        except FileNotFoundError:  # evicted just now
            return None

    def exporting(self, request: BaseRequest) -> bool:
        """Whether a worker is making (or is to make) the export. Only looks: a lost one is
        queued again by ``start`` alone."""
        return self.progress(request) is not None

    def progress(self, request: BaseRequest) -> str | None:
        """queued (waiting for the exports worker), exporting (being made), or None."""
        state, _ = self._state(self.target(request).name)
        return {"waiting": "queued", "running": "exporting"}.get(state)

    def start(self, request: BaseRequest, admit: Callable[[], None]) -> None:
        """Queue the export unless it is kept or on its way; ``admit`` is called (and may
        refuse by raising) only by the start that claims it. A failure of the last attempt
        is raised once, and the next start tries again; a lost run is queued again."""
        if self.is_kept(request):
            return
        name = self.target(request).name
        state, marker = self._state(name)
        if state in ("waiting", "running"):
            return
        if state == "failed":
            raise BaseExportFailed(self._take_failure(name, marker))
        job_id = run_job_id(name)
        key = marker_key(self.queue_name, name)
        if state == "lost":  # queued again: nothing new starts, nothing is counted
            if replace_marker(self.connection, key, marker, marker_value(job_id)):
                self._delete_job(marker.split()[0])
                enqueue_run(self.queue, asdict(request), name, self.max_cache_bytes, job_id)
            return
        if not self.connection.set(key, marker_value(job_id), nx=True, ex=MARKER_TTL_S):
            return  # another start claimed it just now: this one joins it
        try:
            admit()
        except BaseException:
            self.connection.delete(key)
            raise
        enqueue_run(self.queue, asdict(request), name, self.max_cache_bytes, job_id)

    def _state(self, name: str) -> tuple[str, str | None]:
        """(waiting, running, lost, failed or none; the marker) of the export of file
        ``name``: lost is a run its marker names that no worker runs or will run (its lease
        lapsed, its horse died, or it ended without clearing the marker)."""
        if self.connection.exists(failure_key(self.queue_name, name)):
            return "failed", None
        raw = self.connection.get(marker_key(self.queue_name, name))
        if raw is None:
            return "none", None
        marker = raw.decode()
        job_id, _, queued_at = marker.partition(" ")
        try:
            job = Job.fetch(job_id, connection=self.connection)
        except NoSuchJobError:  # being queued by the start that claimed it, or lost
            young = time.time() - float(queued_at or 0) < LEASE_S
            return ("waiting" if young else "lost"), marker
        status = job.get_status(refresh=False)
        if status in WAITING:
            return "waiting", marker
        if status == JobStatus.FAILED and not _horse_died(job):
            return "failed", marker
        if status != JobStatus.STARTED:
            return "lost", marker
        started_at = job.started_at or datetime.now(UTC)
        recent = datetime.now(UTC) - started_at.replace(tzinfo=UTC) < timedelta(seconds=LEASE_S)
        if recent or self.connection.exists(lease_key(self.queue_name, job.id)):
            return "running", marker
        return "lost", marker

    def _take_failure(self, name: str, marker: str | None) -> str:
        """Why the last attempt failed, forgotten once told (the next start tries again)."""
        reason = self.connection.getdel(failure_key(self.queue_name, name))
        if marker is not None:  # RQ's failed job (the function itself could not run)
            job_id = marker.split()[0]
            with suppress(NoSuchJobError):
                reason = reason or failure_reason(
                    Job.fetch(job_id, connection=self.connection)).encode()
            replace_marker(self.connection, marker_key(self.queue_name, name), marker, None)
            self._delete_job(job_id)
        return reason.decode() if reason else "the worker gave no reason"

    def _delete_job(self, job_id: str) -> None:
        with suppress(NoSuchJobError):
            Job.fetch(job_id, connection=self.connection).delete()


def _horse_died(job: Job) -> bool:
    result = job.latest_result()
    return bool(result and result.exc_string and result.exc_string.startswith(HORSE_DIED))


def failure_reason(job: Job) -> str:
    """The last line of the export's exception, without its class's module path."""
    result = job.latest_result()
    text = (result.exc_string if result is not None else None) or "the worker gave no reason"
    last = text.strip().splitlines()[-1]
    kind, _, message = last.partition(": ")
    return message if message and "." in kind and " " not in kind else last
