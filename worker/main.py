"""``mebp worker``: serve the queue of a shared Redis, database and storage.

Run as many as the machines allow; each takes one job at a time. Only the job id crosses
Redis: the worker reads everything else from the database and the storage root. Base exports
are served by an exports worker of their own (``exports_only``; `mebp serve` starts one
beside its workers, `mebp worker` one beside itself), so none waits behind a training job.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import suppress

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from rq import Worker, worker_registration

from mebp_core.cache import default_cache_dir
from mebp_core.plan.calibration import CalibrationError, load_calibration
from mebp_core.proc import die_with_parent
from mebp_core.store.kernel_build import build_kernel
from service.base_export_queue import MAKE_BASE, exports_queue_name
from service.db import database_url, upgrade_database
from service.queue import RUN_JOB, WORKER_HEARTBEAT_S, connect, job_queue
from service.settings import Settings
from service.supervisor import SUPERVISOR_ENV, WorkerPool
from worker import warm_engine
from worker.base_export import horse_died, oom_kills
from worker.memory_cap import remove_idle_caps
from worker.warm_engine import EngineProcess, Spare

REDIS_WAIT_MAX_S = 5.0
EXPORTS_STOP_S = 5.0  # the exports worker, asked with its worker, is killed after this
# how long the commands thread may wait for a message before it looks whether it should stop;
# a stop waits on that thread (redis-py 8.2 joins it, RQ passes no bound), so this bounds it
COMMANDS_POLL_S = 1.0


class PolledCommands:
    """RQ's commands channel (stop a job, shut down), listened to by a thread that wakes each
    COMMANDS_POLL_S, not RQ's 60 s: a stop joins that thread, and one woken by the
    unsubscribe before the stop was flagged waited out the whole minute. Mixed in before
    RQ's worker class."""

    def subscribe(self) -> None:
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=COMMANDS_POLL_S, daemon=True,
            exception_handler=self._pubsub_exception_handler)


class ServiceWorker(PolledCommands, Worker):
    """RQ's worker, heartbeating every WORKER_HEARTBEAT_S idle or busy (so a dead one drops
    out of the API's count soon), listed again after Redis restarted empty, and back on the
    queue within seconds of Redis returning. On SIGTERM or SIGINT it stops (RQ's warm
    shutdown) once its horse has given the job back (``worker.stopping``), not once the job
    is done; a second signal, a second or more later, is RQ's cold shutdown (the horse
    killed, its job re-queued when its heartbeat goes stale)."""

    max_connection_wait_time = REDIS_WAIT_MAX_S

    def __init__(self, queues, spare: Spare | None = None,
                 exports: WorkerPool | None = None, queue_name: str | None = None,
                 **kwargs) -> None:
        # RQ blocks on the queue for worker_ttl - 15 s between idle heartbeats
        kwargs.setdefault("worker_ttl", WORKER_HEARTBEAT_S + 15)
        kwargs.setdefault("job_monitoring_interval", WORKER_HEARTBEAT_S)
        super().__init__(queues, **kwargs)
        self.spare = spare  # an engine started ahead of each training job
        self.handed: EngineProcess | None = None
        self.exports = exports  # `mebp worker`'s own exports worker: stopped with it
        self.queue_name = queue_name  # the service's, for the exports worker's exports
        self.oom_kills_before = 0

    def fork_work_horse(self, job, queue) -> None:
        if job.func_name == MAKE_BASE:
            self.oom_kills_before = oom_kills()
        if self.spare is None or job.func_name != RUN_JOB:
            super().fork_work_horse(job, queue)
            return
        # the horse inherits this engine; the next job's imports while this one runs
        self.handed = self.spare.hand_over()
        super().fork_work_horse(job, queue)
        warm_engine.HANDED = None  # the horse's now, not this process's

    def execute_job(self, job, queue) -> None:
        super().execute_job(job, queue)
        # the horse has exited (an error above leaves its engine to die with it): reap its
        # engine, or end it if the horse took no job
        if self.handed is not None:
            self.handed.discard()
            self.handed = None

    def handle_work_horse_killed(self, job, retpid, ret_val, rusage) -> None:
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)
        if job.func_name == MAKE_BASE and self.queue_name is not None:
            horse_died(job, self.queue_name, stopping=self._shutdown_requested_date is not None,
                       signal_number=os.WTERMSIG(ret_val) if ret_val and os.WIFSIGNALED(ret_val)
                       else None, oom_kills_before=self.oom_kills_before)

    def request_stop(self, signum, frame) -> None:
        if self.exports is not None:
            self.exports.request_stop()
        if self.horse_pid:  # the horse runs in a process group of its own: tell it
            with suppress(ProcessLookupError):
                os.kill(self.horse_pid, signum)
        super().request_stop(signum, frame)

    def heartbeat(self, timeout=None, pipeline=None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            worker_registration.register(self, pipeline)
            return
        with self.connection.pipeline() as own:
            super().heartbeat(timeout, own)
            worker_registration.register(self, own)
            own.execute()


def wait_for_redis(connection: redis.Redis) -> None:
    """Block until Redis answers, rather than exit and be restarted in a loop while it is
    down (`mebp serve` restarts its embedded Redis; a shared one comes back by itself):
    0.5 s after the first failure, doubling up to REDIS_WAIT_MAX_S."""
    forever = Retry(ExponentialBackoff(cap=REDIS_WAIT_MAX_S, base=0.25), retries=-1,
                    supported_errors=(redis.ConnectionError,))
    forever.call_with_retry(connection.ping, lambda exc: print(
        f"mebp worker: waiting for Redis: {exc}", file=sys.stderr, flush=True))


def work(settings: Settings, *, burst: bool = False, exports_only: bool = False) -> int:
    if settings.redis_url is None:
        print("mebp worker: REDIS_URL is not set (the Redis of the service to serve; "
              "`mebp serve` prints it)", file=sys.stderr)
        return 2
    if SUPERVISOR_ENV in os.environ:  # started by `mebp serve`: stop when it does
        die_with_parent(signal.SIGTERM, int(os.environ[SUPERVISOR_ENV]))
    # the job functions RQ runs in forked horses read Settings from the environment: a data
    # dir given on the command line (`mebp worker --data-dir`) must reach them too
    os.environ["MEBP_DATA_DIR"] = str(settings.data_dir)
    settings.storage_root.mkdir(parents=True, exist_ok=True)
    if exports_only:
        return work_exports(settings, burst=burst)
    remove_idle_caps()  # cgroups of jobs whose worker died on this host
    if build_kernel(settings.cache_dir) is None:  # here, not in a job's engine inside its cap
        print("mebp worker: no C compiler: jobs dequantize with torch", file=sys.stderr)
    # this host's calibration, which plans its jobs: measured now (after the kernel it keys
    # on is built), outside any job's cap and not during the first job, at the thread counts
    # jobs take most (every core free, or one)
    try:
        for threads in sorted({settings.plan_threads, settings.threads or 1}):
            load_calibration(settings.cache_dir or default_cache_dir(), threads)
    except CalibrationError as exc:  # each job's plan tries again, and fails it if it must
        print(f"mebp worker: {exc}", file=sys.stderr, flush=True)
    upgrade_database(database_url(settings.database_url, settings.data_dir))
    # RQ forks a horse per job: imported once here (torch with them), not again in each
    import worker.coordinator  # noqa: F401
    import worker.runner  # noqa: F401
    queue = job_queue(connect(settings.redis_url), settings.queue_name)
    wait_for_redis(queue.connection)
    spare = Spare(settings.enforcement, settings.cache_dir or default_cache_dir())
    spare.fill()
    # `mebp serve` runs the exports worker itself; `mebp worker` alone runs its own
    exports = None if SUPERVISOR_ENV in os.environ or burst else \
        WorkerPool(settings, exports_only=True)
    print(f"mebp worker: serving queue {settings.queue_name!r}", file=sys.stderr, flush=True)
    try:
        ServiceWorker([queue], spare=spare, exports=exports, connection=queue.connection).work(
            burst=burst, logging_level="WARNING")
    finally:
        spare.close()
        if exports is not None:
            exports.stop(deadline=time.monotonic() + EXPORTS_STOP_S)
    return 0


def work_exports(settings: Settings, *, burst: bool) -> int:
    """Serve the exports queue alone: no engine, calibration or database of its own."""
    exports = job_queue(connect(settings.redis_url), exports_queue_name(settings.queue_name))
    wait_for_redis(exports.connection)
    print(f"mebp worker: serving base exports of {settings.queue_name!r}", file=sys.stderr,
          flush=True)
    ServiceWorker([exports], queue_name=settings.queue_name,
                  connection=exports.connection).work(
        burst=burst, logging_level="WARNING")
    return 0
