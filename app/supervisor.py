"""The workers `mebp serve` runs: started as `mebp worker` subprocesses, restarted when one
exits, and stopped with RQ's warm, then cold, shutdown."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading

from app.settings import Settings

log = logging.getLogger("mebp.supervisor")
SUPERVISOR_ENV = "MEBP_SUPERVISOR_PID"
STOP_WAIT_S = 5.0
CHECK_EVERY_S = 1.0


class WorkerPool:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.processes = [self._start() for _ in range(settings.workers)]
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mebp-workers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """RQ's warm shutdown (finish the job), then its cold one (abandon it), then a kill."""
        self._stopping.set()
        self._thread.join()
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
            for process in self.processes:
                if process.poll() is None:
                    process.send_signal(sig)
            for process in self.processes:
                try:
                    process.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass

    def _watch(self) -> None:
        while not self._stopping.wait(CHECK_EVERY_S):
            for index, process in enumerate(self.processes):
                if process.poll() is not None and not self._stopping.is_set():
                    log.warning("worker %d exited with code %s; starting another", process.pid,
                                process.returncode)
                    self.processes[index] = self._start()

    def _start(self) -> subprocess.Popen:
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
        return subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env)
