"""The processes `mebp serve` keeps running: its workers (`mebp worker` subprocesses), with
them one exports worker (base exports only: never behind a training job), and the embedded
Redis; each is started again when it exits, after a growing delay while it keeps
exiting soon after it started, until the service stops: then none is restarted, each worker
is asked to stop once (SIGTERM: it gives its job back to the queue, ``worker.stopping``) and
killed if it has not exited by the service's deadline."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from service.settings import Settings

log = logging.getLogger("mebp.supervisor")
SUPERVISOR_ENV = "MEBP_SUPERVISOR_PID"
CHECK_EVERY_S = 0.5
# a process that exits sooner than this after its start is failing to start, not ending a
# long run: it is restarted after a delay doubling from 1 s to MAX_RESTART_DELAY_S
QUICK_EXIT_S = 10.0
MAX_RESTART_DELAY_S = 30.0


class Child:
    """One process kept running: ``start`` makes it, and again whenever it has exited."""

    def __init__(self, name: str, start: Callable[[], subprocess.Popen]) -> None:
        self.name, self._start = name, start
        self.delay_s = 0.0
        self._restart_at: float | None = None
        self.process = start()
        self.started_at = time.monotonic()

    def keep_running(self) -> None:
        if self.process.poll() is None:
            return
        now = time.monotonic()
        if self._restart_at is None:
            quick = now - self.started_at < QUICK_EXIT_S
            self.delay_s = min(MAX_RESTART_DELAY_S, max(1.0, 2 * self.delay_s)) if quick else 0.0
            self._restart_at = now + self.delay_s
            log.warning("%s %d exited with code %s; starting another in %.0f s", self.name,
                        self.process.pid, self.process.returncode, self.delay_s)
        if now >= self._restart_at:
            self._restart_at = None
            self.started_at = now  # a start that raises counts as a quick exit
            self.process = self._start()
            log.warning("%s restarted as %d", self.name, self.process.pid)


class Watcher:
    """A thread restarting ``children`` that exit, until stopped."""

    def __init__(self, name: str, children: list[Child]) -> None:
        self.children = children
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """No restart after the watch's current check: quick, never waits (a signal handler
        may call it while this thread waits on a lock the handler's thread holds)."""
        self._stopping.set()

    def stop(self) -> None:
        """No restart from now on (once this returns); safe to call again."""
        self._stopping.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stopping.wait(CHECK_EVERY_S):
            for child in self.children:
                if self._stopping.is_set():
                    return
                try:
                    child.keep_running()
                except Exception:  # noqa: BLE001  (the watch must outlive one failed start)
                    log.exception("could not restart %s", child.name)


EXPORTS_ONLY_FLAG = "--exports-only"


class WorkerPool:
    """``workers`` training workers and, with any, one exports worker (``exports_only``: the
    exports worker alone, as `mebp worker` keeps its own)."""

    def __init__(self, settings: Settings, *, exports_only: bool = False) -> None:
        self.settings = settings
        self.children = [] if exports_only else \
            [Child("worker", self._start) for _ in range(settings.workers)]
        if exports_only or self.children:
            self.children.append(Child("exports worker", lambda: self._start(EXPORTS_ONLY_FLAG)))
        self._stop_requested = False
        self._asked: set[int] = set()  # pids sent their SIGTERM
        self._watcher = Watcher("mebp-workers", self.children)

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [child.process for child in self.children]

    def request_stop(self) -> None:
        """Restart no worker from now on and ask each to stop: one SIGTERM (a second would be
        RQ's cold shutdown, abandoning the job). Quick, so a signal handler may call it; a
        second call does nothing."""
        if self._stop_requested:
            return
        self._stop_requested = True
        self._watcher.request_stop()
        self._ask_to_stop()

    def _ask_to_stop(self) -> None:
        for process in self.processes:
            if process.poll() is None and process.pid not in self._asked:
                self._asked.add(process.pid)
                process.send_signal(signal.SIGTERM)

    def stop(self, deadline: float) -> None:
        """Stop the workers: asked (if not yet), then killed at ``deadline`` (monotonic)."""
        self.request_stop()
        self._watcher.stop()
        self._ask_to_stop()  # one the watch restarted before it saw the stop
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop in time: killed", process.pid)
                process.kill()
                process.wait()

    def _start(self, *flags: str) -> subprocess.Popen:
        settings = self.settings
        env = {**os.environ, "MEBP_DATA_DIR": str(settings.data_dir),
               "REDIS_URL": settings.redis_url, "MEBP_QUEUE_NAME": settings.queue_name,
               "MEBP_ENFORCEMENT": settings.enforcement}
        for name, value in (("DATABASE_URL", settings.database_url),
                            ("MEBP_CACHE_DIR", settings.cache_dir),
                            ("MEBP_STORAGE_DIR", settings.storage_dir),
                            ("MEBP_THREADS", settings.threads)):
            if value is not None:
                env[name] = str(value)
        env[SUPERVISOR_ENV] = str(os.getpid())  # the worker stops when we die, however
        return subprocess.Popen([sys.executable, "-m", "worker", *flags], env=env)
