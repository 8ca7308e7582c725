"""Engine processes started ahead of their jobs, so a job does not wait for an interpreter
to start and import torch.

A worker keeps one engine process waiting (``python -m worker.child --wait FD``). It has
joined a cgroup of its own that has no limit yet, imported what training needs, and reads
its job from a pipe. The horse that runs the next job takes it over: it names the cgroup
for the job's attempt and sets the job's limit *before* it sends the job, so the job's every
allocation is capped, and the imports are charged to the job exactly as in a process
started for it (the planner's runtime). Still one process per job: it exits with its job,
and the worker starts the next one while the job runs. The engine is not the horse's
child, so the horse learns of its end from a pidfd and reads its exit status from
``/proc`` (the worker reaps it only once the horse has exited).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from worker.child import PARENT_ENV, WAIT_FLAG
from worker.memory_cap import WAITING_PREFIX, MemoryCap, MemoryCapError, open_memory_cap

JOIN_POLL_S = 0.005
JOIN_TIMEOUT_S = 120.0  # an interpreter's start, on a host at any load


class EngineStartError(RuntimeError):
    """An engine started ahead of its job ended before it could be handed one."""


class EngineProcess:
    """One engine process and its cap; handed to a job with ``assign``. Offers what the
    runner uses of ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``kill``,
    ``send_signal``, ``returncode``) from the worker that started it and from its horse."""

    def __init__(self, popen: subprocess.Popen, cap: MemoryCap, warning: str | None,
                 control_fd: int) -> None:
        self.popen, self.cap, self.warning = popen, cap, warning
        self.pid, self.owner = popen.pid, os.getpid()
        self._control_fd: int | None = control_fd
        self._pidfd = os.pidfd_open(popen.pid)
        self.returncode: int | None = None

    @classmethod
    def start(cls, enforcement: str, cache_dir: Path) -> EngineProcess:
        """An engine in a fresh cgroup without a limit, importing what training needs, its
        life tied to this process's."""
        cap, warning = open_memory_cap(enforcement, WAITING_PREFIX + os.urandom(8).hex(), None)
        read_fd, write_fd = os.pipe()
        try:
            env = {**os.environ, **cap.child_env(), PARENT_ENV: str(os.getpid()),
                   # the engine finds the kernel this worker built in the same cache
                   "MEBP_CACHE_DIR": str(cache_dir)}
            # a group of its own, as the horses' engines had: a stop signalled to the
            # service's group reaches it once, from its horse (a second signal would end
            # it without its checkpoint)
            popen = subprocess.Popen([sys.executable, "-m", "worker.child", WAIT_FLAG,
                                      str(read_fd)], pass_fds=(read_fd,), env=env,
                                     process_group=0)
        except BaseException:
            os.close(write_fd)
            cap.close()
            raise
        finally:
            os.close(read_fd)
        return cls(popen, cap, warning, write_fd)

    @property
    def started_ahead(self) -> bool:
        """Started by the worker before this process (its horse) took it."""
        return self.owner != os.getpid()

    @property
    def waiting(self) -> bool:
        """Not handed a job yet (in this process), and alive."""
        return self._control_fd is not None and self.poll() is None

    def assign(self, job_dir: Path, cap_name: str, limit_bytes: int) -> None:
        """Hand the engine its job: the cap takes the attempt's name and the job's limit,
        then the engine reads the job (and from then on dies with this process)."""
        self._wait_joined()
        self.cap.rename(cap_name)
        self.cap.set_limit(limit_bytes, self.pid)
        os.write(self._control_fd, f"{job_dir}\n{os.getpid()}\n".encode())
        self.close_control()

    def _wait_joined(self) -> None:
        """Until the engine has joined its cap by the cap's name, its first act (within
        its interpreter's start; it is not renamed from under it)."""
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not self.cap.holds(self.pid):
            if self.wait_exit(JOIN_POLL_S):
                raise EngineStartError(f"the engine (pid {self.pid}) exited with code "
                                       f"{self.poll()} before it joined its memory cap")
            if time.monotonic() > deadline:
                raise EngineStartError(f"the engine (pid {self.pid}) did not join its memory "
                                       f"cap within {JOIN_TIMEOUT_S:.0f} s")

    def close_control(self) -> None:
        if self._control_fd is not None:
            os.close(self._control_fd)
            self._control_fd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            if os.getpid() == self.owner:
                self.returncode = self.popen.poll()
            elif select.select([self._pidfd], [], [], 0)[0]:
                self.returncode = exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if os.getpid() == self.owner:
            self.returncode = self.popen.wait(timeout)
            return self.returncode
        if not self.wait_exit(timeout):
            raise subprocess.TimeoutExpired(self.popen.args, timeout)
        return self.poll()

    def wait_exit(self, timeout: float) -> bool:
        """Block until the engine exits or ``timeout`` passes; whether it exited."""
        return bool(select.select([self._pidfd], [], [], timeout)[0])

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            with suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def discard(self) -> None:
        """In the process that started it: end it (if its job has not), reap it and remove
        its cap."""
        self.close_control()
        self.kill()
        self.popen.wait()
        self.cap.close()
        os.close(self._pidfd)


def exit_status(pid: int) -> int:
    """The exit status of a process that has exited but not been reaped (a zombie), as
    ``Popen.returncode`` gives it: the ``exit_code`` field of ``/proc/PID/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # field 3 onwards; the name may hold spaces
    return os.waitstatus_to_exitcode(int(fields[52 - 3]))


class Spare:
    """The worker's engine waiting for the next job: handed to the horse the worker forks
    for a job (the horse inherits it), replaced before that fork (so the horse knows the
    engine importing beside it is its worker's, not other work), and reaped once the horse
    has exited. Failing to start one fails no job: the horse then starts its own."""

    def __init__(self, enforcement: str, cache_dir: Path) -> None:
        self.enforcement, self.cache_dir = enforcement, cache_dir
        self.next: EngineProcess | None = None

    def fill(self) -> None:
        global STARTING_PID
        if self.next is not None and not self.next.waiting:
            self.next.discard()
            self.next = None
        if self.next is None:
            try:
                self.next = EngineProcess.start(self.enforcement, self.cache_dir)
            except (OSError, MemoryCapError) as exc:
                print(f"mebp worker: no engine started ahead of the next job ({exc}); its "
                      "horse starts one", file=sys.stderr, flush=True)
        STARTING_PID = None if self.next is None else self.next.pid

    def hand_over(self) -> EngineProcess | None:
        """The engine for the horse about to be forked (``HANDED`` there), and the next
        one started."""
        global HANDED
        self.fill()
        HANDED, self.next = self.next, None
        self.fill()
        return HANDED

    def close(self) -> None:
        if self.next is not None:
            self.next.discard()
            self.next = None


# in a horse: the engine its worker started for it, and the one its worker started next
# (importing beside this job: its CPU is the worker's own, counted free by the job's
# idle-core sample)
HANDED: EngineProcess | None = None
STARTING_PID: int | None = None


def engine_for_job(enforcement: str, cache_dir: Path) -> EngineProcess:
    """In the horse: the engine its worker started ahead, or one started now (a worker run
    without a spare, or one whose spare died)."""
    global HANDED
    engine, HANDED = HANDED, None
    if engine is not None and engine.poll() is None:
        return engine
    return EngineProcess.start(enforcement, cache_dir)
