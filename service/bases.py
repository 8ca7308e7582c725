"""Base models exported for download: made once per (packed model, format, dtype or GGUF
block type) by a worker (service/base_export_queue.py queues it, worker/base_export.py runs
it), and kept under the storage root with the sha256 of the exact bytes served, within a
bound in bytes, least recently served evicted first (service/base_cache.py).

A request finds the kept file; starting its export is the caller's decision (who may, and
within which quota, is the API's), and the client is told to come back: packing and
exporting a large model takes minutes, longer than a request should wait.
The Hugging Face and MLX directories are served as zips whose one top-level folder is the
name the adapters give their base (MLX: with ``-mlx``), so unzipping one beside an adapter
makes the adapter loadable.
"""

from __future__ import annotations

import logging
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mebp_core.atomic import try_lock
from mebp_core.errors import MebpError
from mebp_core.store.export_base_common import base_model_name
from mebp_core.store.resolve import packed_dir, resolve_model
from service.base_cache import (
    EVICTION_WAIT_S,
    evict_least_recently_served,
    eviction_lock_path,
    lock_path,
    record_served,
)
from service.storage import bases_dir, digest_path, kept_digest, write_with_digest, zip_directory

MEDIA_TYPES = {"hf": "application/zip", "mlx": "application/zip",
               "gguf": "application/octet-stream"}
SUFFIXES = {"hf": ".zip", "mlx": ".zip", "gguf": ".gguf"}
log = logging.getLogger("mebp")


class BaseExportFailed(MebpError):
    """The export of a base failed; its last words say why."""


@dataclass(frozen=True)
class BaseRequest:
    source: str  # preset:NAME or a registered model's directory
    quant: str  # the store's: none, int8, int4
    group_size: int
    fmt: str
    dtype: str
    gguf_quant: str | None = None  # q4_1 or q8_0: GGUF blocks of the store

    @property
    def variant(self) -> str:
        """What the export stores, as its file name and the API say it."""
        if self.gguf_quant is not None:
            return self.gguf_quant
        return f"mlx-{self.dtype}" if self.fmt == "mlx" else self.dtype


@dataclass(frozen=True)
class ExportedBase:
    file: BinaryIO  # open: the download reads it whole even if it is evicted meanwhile
    filename: str
    media_type: str
    sha256: str


def base_target(request: BaseRequest, storage_root: Path, cache_dir: Path) -> Path:
    """Where the export of ``request`` is kept."""
    name = base_model_name(packed_dir(request.source, request.quant, request.group_size,
                                      cache_dir))
    return bases_dir(storage_root) / f"{name}-{request.variant}{SUFFIXES[request.fmt]}"


def open_kept(request: BaseRequest, path: Path) -> ExportedBase | None:
    """The kept export at ``path``, opened and recorded as served now; None if not made."""
    try:
        file = open(path, "rb")  # noqa: SIM115 (the response closes it)
    except FileNotFoundError:
        return None
    sha256 = kept_digest(path)
    if sha256 is None:  # being made, or evicted just now
        file.close()
        return None
    record_served(path)
    return ExportedBase(file, path.name, MEDIA_TYPES[request.fmt], sha256)


def is_kept(path: Path) -> bool:
    return digest_path(path).is_file()


def make_base(request: BaseRequest, path: Path, cache_dir: Path,
              max_cache_bytes: int) -> Path | None:
    """Make the export of ``request`` at ``path`` unless it is kept; None, at once, if
    another maker on this machine holds it (its own run makes it). What a maker killed
    mid-way left is removed first, and nothing is at the target until it is whole (its
    digest written last)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with try_lock(lock_path(path)) as held:
        if not held:
            return None
        if is_kept(path):
            return path
        remove_leftovers(path)
        model_dir = resolve_model(request.source, quant=request.quant,
                                  group_size=request.group_size, cache_dir=cache_dir,
                                  isolated=True)
        write_export(model_dir, request, path)
    try:
        evicted = evict_least_recently_served(path.parent, max_cache_bytes, path)
    except OSError as exc:  # the export is made: a failed eviction waits for the next
        log.warning("evicting base exports failed: %s", exc)
        return path
    if evicted is None:
        log.warning("evicting base exports skipped: another process held %s for %g s, "
                    "hung (the exports may exceed MEBP_MAX_BASE_CACHE_BYTES meanwhile)",
                    eviction_lock_path(path.parent), EVICTION_WAIT_S)
        return path
    for gone in evicted:
        log.info("base export %s evicted (MEBP_MAX_BASE_CACHE_BYTES)", gone.name)
    return path


def remove_leftovers(path: Path) -> None:
    """What a killed maker of ``path`` left: its scratch and staged files (the export's and
    its digest's), and the export itself if it was killed before writing the digest."""
    for pattern in (f".{path.name}.tmp-*", f".{digest_path(path).name}.tmp-*"):
        for leftover in path.parent.glob(pattern):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    path.unlink(missing_ok=True)  # not kept (no digest): uncounted, and made again now


def write_export(model_dir: Path, request: BaseRequest, path: Path) -> None:
    """Write the export of ``model_dir`` at ``path`` and its sha256 beside it, made in a
    scratch directory beside it (a killed maker's is removed by the next, ``make_base``)."""
    from mebp_core.store.export_base import export_base  # torch: a worker's, not the API's

    name = base_model_name(model_dir)
    scratch = path.parent / f".{path.name}.tmp-work"
    scratch.mkdir()
    try:
        if request.fmt == "gguf":
            made = export_base(model_dir, "gguf", scratch / "base.gguf", dtype=request.dtype,
                               gguf_quant=request.gguf_quant)
            write_with_digest(path, lambda staging: os.replace(made, staging))
            return
        made = export_base(model_dir, request.fmt, scratch / "base", dtype=request.dtype)
        top = name + ("-mlx" if request.fmt == "mlx" else "")
        # weights do not compress: stored, not deflated
        write_with_digest(path, lambda staging: zip_directory(
            made, staging, top=top, compression=zipfile.ZIP_STORED))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
