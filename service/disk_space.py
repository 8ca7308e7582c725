"""Free space on the service's disks. Health calls a disk full below a threshold, and the
workers keep some room in reserve on the data dir's disk (where the embedded database and
Redis live), given back when a job finds that disk full, so even its failure can be written.
A reserve given back and not yet remade counts as used: the disk reads full until there is
room again, and while it reads full no job starts (its end could not be recorded)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from mebp_core.errors import out_of_space as files_out_of_space
from mebp_core.units import MB
from service.settings import Settings

RESERVE_NAME = ".mebp-disk-reserve"


def out_of_space(exc: BaseException) -> bool:
    """A file's ENOSPC or EDQUOT (``mebp_core.errors.out_of_space``), or a database's disk
    full, as SQLAlchemy raises it (SQLite: "database or disk is full"; PostgreSQL: SQLSTATE
    53100)."""
    if files_out_of_space(exc):
        return True
    orig = getattr(exc, "orig", None)
    return orig is not None and ("database or disk is full" in str(orig)
                                 or getattr(orig, "sqlstate", None) == "53100")


def storage_state(settings: Settings) -> str:
    """``"full"`` when the storage root or the data dir has less than
    ``min_free_storage_bytes`` usable; else ``"ok"``."""
    if free_bytes(settings.storage_root) < settings.min_free_storage_bytes:
        return "full"
    return "ok" if data_dir_short_of_room(settings) is None else "full"


def data_dir_short_of_room(settings: Settings) -> str | None:
    """Why the data dir's disk reads full (less than ``min_free_storage_bytes`` usable, a
    reserve not held counting as used), or None. A worker starts no job then: with no
    reserve held, a job that filled the disk could not record its end."""
    missing = reserve_shortfall_bytes(settings.data_dir, settings.storage_reserve_bytes)
    free = free_bytes(settings.data_dir)
    if free - missing >= settings.min_free_storage_bytes:
        return None
    return (f"the data dir's disk has {free / MB:.2f} MB free, less than "
            f"{settings.min_free_storage_bytes / MB:.0f} MB (MEBP_MIN_FREE_STORAGE_BYTES)"
            + (f" beside the {missing / MB:.0f} MB kept in reserve to record a job's end on a "
               f"full disk (MEBP_STORAGE_RESERVE_BYTES)" if missing else ""))


def free_bytes(path: Path) -> int:
    """Free bytes on ``path``'s disk (its nearest existing parent's: it is made on first use)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def keep_reserve(data_dir: Path, size_bytes: int, min_free_bytes: int) -> None:
    """Make the reserve if it is missing and the disk keeps ``min_free_bytes`` beside it: so
    the reserve is held whenever the data dir does not read full (``data_dir_short_of_room``)."""
    path = Path(data_dir) / RESERVE_NAME
    if size_bytes <= 0 or path.exists() or not Path(data_dir).is_dir() or \
            shutil.disk_usage(data_dir).free < size_bytes + min_free_bytes:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another worker made it just now
        return
    try:
        os.posix_fallocate(fd, 0, size_bytes)  # blocks really taken, not a sparse file
    except OSError:
        path.unlink(missing_ok=True)  # the disk filled meanwhile: no reserve this time
    finally:
        os.close(fd)


def release_reserve(data_dir: Path) -> bool:
    """Give the reserve's room back to the disk; False if there was none to give."""
    with contextlib.suppress(FileNotFoundError):
        (Path(data_dir) / RESERVE_NAME).unlink()
        return True
    return False


def reserve_shortfall_bytes(data_dir: Path, size_bytes: int) -> int:
    """How much of the reserve is not held on the disk now (all of it before a worker first
    makes it, or after it was given back)."""
    try:
        held = os.stat(Path(data_dir) / RESERVE_NAME).st_blocks * 512
    except FileNotFoundError:
        held = 0
    return max(0, size_bytes - held)
