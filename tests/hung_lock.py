"""A file lock held by a process that hangs: it took the flock, then stopped (SIGSTOP, as a
host that hangs or a test's freeze leaves it), so it holds the lock until it is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLD = """import fcntl, sys, time
lock = open(sys.argv[1], "w")
fcntl.flock(lock, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(3600)
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
