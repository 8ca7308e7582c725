"""Base models exported for download: made once per (packed model, format, dtype) by a child
``mebp export-base`` (its memory never counts against the API process), in the background,
and kept under the storage root with the sha256 of the exact bytes served, within a bound in
bytes, least recently served evicted first (service/base_cache.py).

A request finds the kept file; starting its export is the caller's decision (who may, and
within which quota, is the API's), and the client is told to come back: packing and
dequantizing a large model takes minutes, longer than a request should wait.
The Hugging Face directory is served as a zip whose one top-level folder is the name the
adapters give their base, so unzipping it beside an adapter makes the adapter loadable.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mebp_core.errors import MebpError
from mebp_core.proc import die_with_parent
from mebp_core.store.export_base_common import base_model_name
from mebp_core.store.resolve import packed_dir, resolve_model
from service.base_cache import evict_least_recently_served, record_served
from service.storage import bases_dir, digest_path, kept_digest, write_with_digest, zip_directory

MEDIA_TYPES = {"hf": "application/zip", "gguf": "application/octet-stream"}
SUFFIXES = {"hf": ".zip", "gguf": ".gguf"}
log = logging.getLogger("mebp")


class BaseExportFailed(MebpError):
    """The export of a base failed; its last words say why."""


@dataclass(frozen=True)
class BaseRequest:
    source: str  # preset:NAME or a registered model's directory
    quant: str
    group_size: int
    fmt: str
    dtype: str


@dataclass(frozen=True)
class ExportedBase:
    file: BinaryIO  # open: the download reads it whole even if it is evicted meanwhile
    filename: str
    media_type: str
    sha256: str


class BaseExports:
    """The exports of one process: each made by a background thread waiting on its child;
    a failure is reported to the next start of it, which then tries again."""

    def __init__(self, storage_root: Path, cache_dir: Path, max_cache_bytes: int) -> None:
        self.storage_root, self.cache_dir = storage_root, cache_dir
        self.max_cache_bytes = max_cache_bytes
        self._lock = threading.Lock()
        self._running: set[Path] = set()
        self._failed: dict[Path, str] = {}
        self._one_at_a_time = threading.Lock()  # each export is a model's worth of disk I/O

    def target(self, request: BaseRequest) -> Path:
        name = base_model_name(packed_dir(request.source, request.quant, request.group_size,
                                          self.cache_dir))
        return bases_dir(self.storage_root) / f"{name}-{request.dtype}{SUFFIXES[request.fmt]}"

    def open(self, request: BaseRequest) -> ExportedBase | None:
        """The kept export, opened and recorded as served now; None if it is not made."""
        path = self.target(request)
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

    def is_kept(self, request: BaseRequest) -> bool:
        return digest_path(self.target(request)).is_file()

    def exporting(self, request: BaseRequest) -> bool:
        """Whether this process is making (or about to make) the export."""
        with self._lock:
            return self.target(request) in self._running

    def start(self, request: BaseRequest, admit: Callable[[], None]) -> None:
        """Start the export unless it is being made; ``admit`` is called (and may refuse by
        raising) only when one starts. A failure of the last attempt is raised once."""
        path = self.target(request)
        with self._lock:
            if path in self._failed:
                raise BaseExportFailed(self._failed.pop(path))
            if path in self._running or digest_path(path).is_file():  # made meanwhile
                return
            admit()
            self._running.add(path)
            threading.Thread(target=self._make, args=(request, path), daemon=True,
                             name=f"mebp-export-{path.name}").start()

    def _make(self, request: BaseRequest, path: Path) -> None:
        try:
            with self._one_at_a_time:
                model_dir = resolve_model(request.source, quant=request.quant,
                                          group_size=request.group_size,
                                          cache_dir=self.cache_dir, isolated=True)
                export(model_dir, request.fmt, request.dtype, path, self.cache_dir)
        except Exception as exc:  # reported to the next start, which tries again
            with self._lock:
                self._failed[path] = str(exc)
        else:
            self._evict(keep=path)
        finally:
            with self._lock:
                self._running.discard(path)

    def _evict(self, keep: Path) -> None:
        try:
            evicted = evict_least_recently_served(keep.parent, self.max_cache_bytes, keep)
        except OSError as exc:  # the export is made: a failed eviction waits for the next
            log.warning("evicting base exports failed: %s", exc)
            return
        for path in evicted:
            log.info("base export %s evicted (MEBP_MAX_BASE_CACHE_BYTES)", path.name)


def export(model_dir: Path, fmt: str, dtype: str, path: Path, cache_dir: Path | None) -> None:
    """Write the export of ``model_dir`` at ``path`` and its sha256 beside it."""
    name = base_model_name(model_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=path.parent))
    try:
        out = work / (name + SUFFIXES[fmt] if fmt == "gguf" else name)
        env = dict(os.environ)
        if cache_dir is not None:
            env["MEBP_CACHE_DIR"] = str(cache_dir)
        child = subprocess.run(
            [sys.executable, "-m", "mebp_core.cli", "export-base", str(model_dir),
             "--format", fmt, "--dtype", dtype, "--out", str(out)],
            capture_output=True, text=True, env=env, check=False,
            preexec_fn=lambda: die_with_parent(signal.SIGTERM))
        if child.returncode != 0:
            lines = child.stderr.strip().splitlines() or [f"exit code {child.returncode}"]
            raise BaseExportFailed(lines[-1].removeprefix("mebp: error: "))
        if fmt == "gguf":  # the child wrote it whole
            write_with_digest(path, lambda staging: os.replace(out, staging))
        else:  # weights do not compress: stored, not deflated
            write_with_digest(path, lambda staging: zip_directory(
                out, staging, top=name, compression=zipfile.ZIP_STORED))
    finally:
        shutil.rmtree(work, ignore_errors=True)
