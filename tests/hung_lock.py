"""A file lock held by a process that hangs: it took the flock, then stopped (SIGSTOP, as a
host that hangs or a test's freeze leaves it), so it holds the lock until it is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from waiting import HANG_GUARD_S

T = TypeVar("T")

HOLD = """import fcntl, signal, sys
lock = open(sys.argv[1], "w")
fcntl.flock(lock, fcntl.LOCK_EX)
print("held", flush=True)
signal.pause()
"""


@contextmanager
def held_by_a_hung_process(lock: Path) -> Iterator[subprocess.Popen]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGSTOP)
        yield holder
    finally:
        holder.kill()
        holder.wait()


def finishes(call: Callable[[], T], timeout_s: float = HANG_GUARD_S) -> tuple[T, float]:
    """``call()``'s result and its seconds, run on a thread: an AssertionError if it has
    not returned within ``timeout_s`` (a wait that never ends fails the test, not the
    suite)."""
    outcome: list = []

    def run() -> None:
        start = time.monotonic()
        try:
            outcome.append((call(), time.monotonic() - start))
        except BaseException as exc:  # noqa: BLE001  (raised again in the test's thread)
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="finishes")
    thread.start()
    thread.join(timeout_s)
    assert outcome, f"still waiting after {timeout_s} s"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
