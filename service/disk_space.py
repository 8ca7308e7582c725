"""Free space on the service's disks. Health calls a disk full below a threshold, and the
workers keep some room in reserve on the data dir's disk (where the embedded database and
Redis live), given back when a job finds that disk full, so even its failure can be written.
A reserve given back and not yet remade counts as used: the disk reads full until there is
room again."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from mebp_core.errors import out_of_space as files_out_of_space
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
    missing = reserve_shortfall_bytes(settings.data_dir, settings.storage_reserve_bytes)
    for path, held in ((settings.storage_root, 0), (settings.data_dir, missing)):
        while not path.exists() and path != path.parent:  # made on first use
            path = path.parent
        if shutil.disk_usage(path).free - held < settings.min_free_storage_bytes:
            return "full"
    return "ok"


def keep_reserve(data_dir: Path, size_bytes: int) -> None:
    """Make the reserve if it is missing and the disk has room to spare for it."""
    path = Path(data_dir) / RESERVE_NAME
    if size_bytes <= 0 or path.exists() or not Path(data_dir).is_dir() or \
            shutil.disk_usage(data_dir).free < 4 * size_bytes:
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
