"""Whether a thread that waits on a file lock holds a SQLite database's write meanwhile: the
waiter is seen in /proc/locks (or, a bounded wait, by the lock file it holds open), and the
write lock probed from another connection."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import suppress
from pathlib import Path

from waiting import poll_until


def waited_on(lock: Path) -> bool:
    """Whether a process waits for the flock on ``lock``: blocked on it (a ``->`` line in
    /proc/locks), or a thread of this one, the holder, trying it again and again (a bounded
    wait, ``try_lock``), which holds the file open beside the holder's own."""
    inode = f":{lock.stat().st_ino} "
    return any("-> FLOCK" in line and inode in line
               for line in Path("/proc/locks").read_text().splitlines()) \
        or _opened_here(lock) >= 2


def _opened_here(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    target = path.resolve()
    opened = 0
    for fd in Path("/proc/self/fd").iterdir():
        with suppress(FileNotFoundError):  # closed meanwhile
            opened += fd.readlink() == target
    return opened


def assert_no_write_held_while_waiting(waiter: threading.Thread, lock: Path,
                                       database: Path) -> None:
    """Start ``waiter`` (the caller holds ``lock``), wait until it waits on ``lock``, and
    take the database's write lock from another connection: "database is locked" if the
    waiter holds a write."""
    waiter.start()
    poll_until(lambda: waited_on(lock), bool, timeout_s=60,
               failure=lambda _: f"{waiter.name} never waited on {lock.name}")
    probe = sqlite3.connect(database, timeout=1.0)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.rollback()
    finally:
        probe.close()
