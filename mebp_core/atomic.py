"""Writing artifacts atomically: staged next to their place, swapped in (a directory fsynced
first; a small JSON file as a whole); and one writer at a time where several processes
would otherwise do the same work at once.

An interruption never leaves a half-written artifact, and an existing directory is replaced
only when it is an earlier artifact of the same kind, never a user's folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mebp_core.errors import MebpError

LOCK_POLL_S = 0.05  # how often a bounded wait tries the lock again


class OutputExistsError(MebpError, ValueError):
    """The output path holds something this command must not overwrite."""


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (made if missing) for the block: processes
    on this machine taking the same lock run the block one after another."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextmanager
def try_lock(path: Path, wait_s: float = 0.0) -> Iterator[bool]:
    """Take the exclusive lock on ``path`` if no one holds it, waiting at most ``wait_s``
    for its holder: whether it was taken (held for the block). A bounded wait is for work
    whose caller can go on without the lock (doing the work anyway, or leaving it undone): a
    holder that hangs keeps its lock for good."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    with open(path, "w") as lock:
        while not _lock_now(lock):
            if time.monotonic() >= deadline:
                yield False
                return
            time.sleep(LOCK_POLL_S)
        yield True


def _lock_now(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yield an empty directory next to ``out``; when the block succeeds it replaces ``out``,
    when it fails it vanishes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's 0700 would make the artifact private
    try:
        yield staging
        sync_directory(staging)
        replace_directory(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextmanager
def staged_file(out: Path) -> Iterator[Path]:
    """Yield a path next to ``out`` to write; when the block succeeds the file is fsynced and
    replaces ``out``, when it fails it vanishes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    staging = Path(name)
    try:
        yield staging
        with open(staging, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(staging, 0o666 & ~_umask())
        os.replace(staging, out)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def sync_directory(directory: Path) -> None:
    """fsync every file and the directory, so a rename never exposes unwritten data."""
    for child in directory.iterdir():
        with open(child, "rb") as handle:
            os.fsync(handle.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_replaceable(out: Path, names: set[str]) -> None:
    """Refuse to overwrite ``out`` unless it is missing, empty, or an earlier artifact of the
    same kind (holding only files named in ``names``): never delete a user's directory."""
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputExistsError(f"{out} exists and is not a directory")
    foreign = sorted(child.name for child in out.iterdir() if child.name not in names)
    if foreign:
        raise OutputExistsError(f"{out} exists and holds other files ({', '.join(foreign[:3])}); "
                           "refusing to replace it: choose another output directory")


def replace_directory(staging: Path, out: Path) -> None:
    """Move ``staging`` to ``out``; an old ``out`` is set aside first and deleted after."""
    check_replaceable(out, {child.name for child in staging.iterdir()})
    if not out.exists():
        os.replace(staging, out)
        return
    # POSIX cannot rename onto a non-empty directory: move the old one aside, then swap.
    retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, retired / out.name)
    try:
        os.replace(staging, out)
    except BaseException:
        os.replace(retired / out.name, out)  # if this fails too, the old copy stays in retired
        shutil.rmtree(retired, ignore_errors=True)
        raise
    shutil.rmtree(retired, ignore_errors=True)
    _sync_path(out.parent)


def _sync_path(directory: Path) -> None:
    """fsync a directory so the renames in it survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomically(path: Path, data: object) -> None:
    """``data`` as JSON at ``path``, replacing the file whole: a reader, or another writer
    doing the same, never sees half of it."""
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(data, indent=1))
    os.replace(staging, path)
