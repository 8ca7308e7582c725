"""Engine processes started ahead of their jobs, so a job does not wait for an interpreter
to start and import torch.

A worker keeps one engine process waiting (``python -m worker.child --wait FD``), forked from
its zygote (``worker.engine_zygote``), which imported what training needs once, or, where it
cannot fork one, started as an interpreter of its own. It has joined a cgroup of its own that
has no limit yet, holds what training imports, and reads its job from a pipe. The horse that
runs the next job takes it over: it names the cgroup for the job's attempt and sets the
job's limit *before* it sends the job, so the job's every allocation is capped, and the
imports are charged to the job exactly as in a process started for it (the planner's
runtime). Still one process per job: it exits with its job,
and the worker starts the next one while the job runs. The engine is not the horse's
child, so the horse learns of its end from a pidfd and reads its exit status from
``/proc`` (its parent, the worker or the zygote, reaps it only once the horse has exited).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from mebp_core.allocator import engine_environ
from worker.child import PARENT_ENV, WAIT_FLAG
from worker.engine_zygote import Zygote, ZygoteError
from worker.memory_cap import WAITING_PREFIX, MemoryCap, MemoryCapError, open_memory_cap

JOIN_POLL_S = 0.005
JOIN_TIMEOUT_S = 120.0  # an interpreter's start, on a host at any load


class EngineStartError(RuntimeError):
    """An engine started ahead of its job ended before it could be handed one."""


class EngineProcess:
    """One engine process and its cap; handed to a job with ``assign``. Offers what the
    runner uses of ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``kill``,
    ``send_signal``, ``returncode``) from the worker that started it and from its horse."""

    def __init__(self, pid: int, cap: MemoryCap, warning: str | None, control_fd: int, *,
                 popen: subprocess.Popen | None = None, zygote: Zygote | None = None) -> None:
        self.pid, self.cap, self.warning = pid, cap, warning
        self.popen, self.zygote = popen, zygote  # its parent: this process, or the zygote
        self.owner = os.getpid()
        self._control_fd: int | None = control_fd
        self._pidfd = os.pidfd_open(pid)
        self.returncode: int | None = None

    @classmethod
    def start(cls, enforcement: str, cache_dir: Path) -> EngineProcess:
        """An engine in a fresh cgroup without a limit, importing what training needs, its
        life tied to this process's."""
        def launch(cap: MemoryCap, read_fd: int) -> dict:
            env = engine_environ({**os.environ, **cap.child_env(), PARENT_ENV: str(os.getpid()),
                                  # the engine finds the kernel this worker built in the same
                                  # cache
                                  "MEBP_CACHE_DIR": str(cache_dir)})
            # a group of its own, as the horses' engines had: a stop signalled to the
            # service's group reaches it once, from its horse (a second signal would end
            # it without its checkpoint)
            popen = subprocess.Popen([sys.executable, "-m", "worker.child", WAIT_FLAG,
                                      str(read_fd)], pass_fds=(read_fd,), env=env,
                                     process_group=0)
            return {"pid": popen.pid, "popen": popen}

        return cls._waiting(enforcement, launch)

    @classmethod
    def fork(cls, zygote: Zygote, enforcement: str) -> EngineProcess:
        """An engine forked from ``zygote`` into a fresh cgroup without a limit, charged
        there what an engine ``start`` started would be."""
        return cls._waiting(enforcement, lambda cap, read_fd: {
            "pid": zygote.fork_engine(cap.child_env(), read_fd), "zygote": zygote})

    @classmethod
    def _waiting(cls, enforcement: str,
                 launch: Callable[[MemoryCap, int], dict]) -> EngineProcess:
        """An engine that ``launch`` makes in a fresh cap without a limit, to read its job
        from the pipe it is given."""
        cap, warning = open_memory_cap(enforcement, WAITING_PREFIX + os.urandom(8).hex(), None)
        read_fd, write_fd = os.pipe()
        try:
            made = launch(cap, read_fd)
        except BaseException:
            os.close(write_fd)
            cap.close()
            raise
        finally:
            os.close(read_fd)
        return cls(cap=cap, warning=warning, control_fd=write_fd, **made)

    @property
    def started_ahead(self) -> bool:
        """Started by the worker before this process (its horse) took it."""
        return self.owner != os.getpid()

    @property
    def forked(self) -> bool:
        """Forked from the worker's zygote, not started as an interpreter of its own."""
        return self.zygote is not None

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

    @property
    def _parent(self) -> bool:
        """Whether this process is the engine's parent (may reap it)."""
        return self.popen is not None and os.getpid() == self.owner

    def poll(self) -> int | None:
        if self.returncode is None:
            if self._parent:
                self.returncode = self.popen.poll()
            elif select.select([self._pidfd], [], [], 0)[0]:
                self.returncode = self._exit_status()
        return self.returncode

    def _exit_status(self) -> int:
        """How the engine ended, read off its zombie; -SIGKILL, as a crash, where another
        process reaped it first (its zygote ended and init reaped it), its pid maybe reused."""
        try:
            status = exit_status(self.pid)
            signal.pidfd_send_signal(self._pidfd, 0)  # the pid is still this engine's
        except (FileNotFoundError, ProcessLookupError):
            return -signal.SIGKILL
        return status

    def wait(self, timeout: float | None = None) -> int:
        if self._parent:
            self.returncode = self.popen.wait(timeout)
            return self.returncode
        if not self.wait_exit(timeout):
            raise subprocess.TimeoutExpired(f"engine {self.pid}", timeout)
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
        if self.popen is not None:
            self.popen.wait()
        else:
            with suppress(ZygoteError):  # a zygote gone: init reaped its engines
                self.zygote.reap(self.pid)
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
    engine starting beside it is its worker's, not other work), and reaped once the horse
    has exited. Forked from the worker's zygote; started as an interpreter of its own once
    the zygote has failed (it is not started again). Failing to start one fails no job: the
    horse then starts its own."""

    def __init__(self, enforcement: str, cache_dir: Path) -> None:
        self.enforcement, self.cache_dir = enforcement, cache_dir
        self.next: EngineProcess | None = None
        self.zygote: Zygote | None = None
        self.zygote_failed = False

    def fill(self) -> None:
        global STARTING_PID
        if self.next is not None and not self.next.waiting:
            self.next.discard()
            self.next = None
        if self.next is None:
            try:
                self.next = self._new_engine()
            except (OSError, MemoryCapError) as exc:
                print(f"mebp worker: no engine started ahead of the next job ({exc}); its "
                      "horse starts one", file=sys.stderr, flush=True)
        STARTING_PID = None if self.next is None else self.next.pid

    def _new_engine(self) -> EngineProcess:
        if not self.zygote_failed:
            try:
                if self.zygote is None:
                    self.zygote = Zygote.start(self.cache_dir)
                return EngineProcess.fork(self.zygote, self.enforcement)
            except OSError as exc:
                print(f"mebp worker: {exc}; engines start as interpreters of their own",
                      file=sys.stderr, flush=True)
                self.zygote_failed = True
        return EngineProcess.start(self.enforcement, self.cache_dir)

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
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None


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
