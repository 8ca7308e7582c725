"""A job that ran out of storage ends ``storage_full``: its partial files go (nothing partial
is kept, and a database on the same full disk may need the room), then its end is recorded,
retried briefly while the database's disk is full too."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from service.disk_space import out_of_space, release_reserve
from service.storage import adapter_downloads_dir
from worker.child import ADAPTER, CHECKPOINT, KEPT

STORAGE_FULL_TRIES = 10  # a second apart, recording a storage_full failure on a full disk


def ran_out_of_space(exc: Exception) -> str:
    reason = "the database's disk is full" if isinstance(exc, OperationalError) else \
        "no space left on the device"
    return f"the storage ran out of space ({reason}); nothing partial is kept"


def end_storage_full(session: Session, directory: Path, data_dir: Path,
                     record: Callable[[], None]) -> None:
    """Drop the partial files in the job's ``directory``, then ``record`` its failure,
    giving back the room reserved in ``data_dir`` for this write if the disk is full."""
    for partial in (directory / CHECKPOINT, directory / ADAPTER,
                    adapter_downloads_dir(directory / ADAPTER),
                    *directory.glob(f".{ADAPTER}.tmp-*"),
                    *(directory / KEPT).glob(".step-*")):  # the kept ones are whole: kept
        shutil.rmtree(partial, ignore_errors=True)
    for attempt in range(STORAGE_FULL_TRIES):
        try:
            record()
            return
        except OperationalError as again:
            session.rollback()
            if not out_of_space(again) or attempt == STORAGE_FULL_TRIES - 1:
                raise  # left running: the reconciler ends it once its heartbeat is stale
            release_reserve(data_dir)  # the room kept for this write
            time.sleep(1.0)
