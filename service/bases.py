"""Base models exported for download: made once per (packed model, format, dtype) by a child
``mebp export-base`` (its memory never counts against the API process), in the background,
and kept under the storage root with the sha256 of the exact bytes served.

A request finds the kept file, or starts (or joins) its export and is told to come back:
packing and dequantizing a large model takes minutes, longer than a request should wait.
The Hugging Face directory is served as a zip whose one top-level folder is the name the
adapters give their base, so unzipping it beside an adapter makes the adapter loadable.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mebp_core.atomic import staged_file
from mebp_core.errors import MebpError
from mebp_core.proc import die_with_parent
from mebp_core.store.export_base_common import base_model_name
from mebp_core.store.resolve import packed_dir, resolve_model
from service.storage import bases_dir, sha256_file, zip_directory

MEDIA_TYPES = {"hf": "application/zip", "gguf": "application/octet-stream"}
SUFFIXES = {"hf": ".zip", "gguf": ".gguf"}


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
    path: Path
    filename: str
    media_type: str
    sha256: str


class BaseExports:
    """The exports of one process: each made by a background thread waiting on its child;
    a failure is reported to the next request for it, which then tries again."""

    def __init__(self, storage_root: Path, cache_dir: Path) -> None:
        self.storage_root, self.cache_dir = storage_root, cache_dir
        self._lock = threading.Lock()
        self._running: set[Path] = set()
        self._failed: dict[Path, str] = {}
        self._one_at_a_time = threading.Lock()  # each export is a model's worth of disk I/O

    def target(self, request: BaseRequest) -> Path:
        name = base_model_name(packed_dir(request.source, request.quant, request.group_size,
                                          self.cache_dir))
        return bases_dir(self.storage_root) / f"{name}-{request.dtype}{SUFFIXES[request.fmt]}"

    def find_or_start(self, request: BaseRequest) -> ExportedBase | None:
        """The kept export, or None while it is being made (started now if it was not)."""
        path = self.target(request)
        digest = _digest_file(path)
        if digest.is_file():
            return ExportedBase(path, path.name, MEDIA_TYPES[request.fmt],
                                digest.read_text().strip())
        with self._lock:
            if path in self._failed:
                raise BaseExportFailed(self._failed.pop(path))
            if path not in self._running:
                self._running.add(path)
                threading.Thread(target=self._make, args=(request, path), daemon=True,
                                 name=f"mebp-export-{path.name}").start()
        return None

    def _make(self, request: BaseRequest, path: Path) -> None:
        try:
            with self._one_at_a_time:
                model_dir = resolve_model(request.source, quant=request.quant,
                                          group_size=request.group_size,
                                          cache_dir=self.cache_dir, isolated=True)
                export(model_dir, request.fmt, request.dtype, path, self.cache_dir)
        except Exception as exc:  # reported to the next request, which tries again
            with self._lock:
                self._failed[path] = str(exc)
        finally:
            with self._lock:
                self._running.discard(path)


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
        if fmt == "gguf":
            os.replace(out, path)  # the child wrote and fsynced it whole
        else:
            with staged_file(path) as staging:  # weights do not compress: stored, not deflated
                zip_directory(out, staging, top=name, compression=zipfile.ZIP_STORED)
        with staged_file(_digest_file(path)) as staging:
            staging.write_text(sha256_file(path))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _digest_file(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")
