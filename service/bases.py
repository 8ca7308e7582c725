"""Base models exported for download: made once per (packed model, format, dtype) by a child
``mebp export-base`` (its memory never counts against the API process) and kept under the
storage root with the sha256 of the exact bytes served.

The Hugging Face directory is served as a zip whose one top-level folder is the name the
adapters give their base, so unzipping it beside an adapter makes the adapter loadable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mebp_core.atomic import staged_file
from mebp_core.errors import MebpError
from mebp_core.store.export_base import base_model_name
from service.storage import bases_dir, sha256_file, zip_directory

MEDIA_TYPES = {"hf": "application/zip", "gguf": "application/octet-stream"}
SUFFIXES = {"hf": ".zip", "gguf": ".gguf"}


class BaseExportFailed(MebpError):
    """The child exporting a base failed; its last words say why."""


@dataclass(frozen=True)
class ExportedBase:
    path: Path
    filename: str
    media_type: str
    sha256: str


def exported_base(storage_root: Path, model_dir: Path, fmt: str, dtype: str,
                  cache_dir: Path | None) -> ExportedBase:
    """The export of the packed model ``model_dir``, made now if it is not kept yet."""
    name = base_model_name(model_dir)
    filename = f"{name}-{dtype}{SUFFIXES[fmt]}"
    path = bases_dir(storage_root) / filename
    digest_file = path.with_name(path.name + ".sha256")
    if not digest_file.is_file():
        _export(model_dir, fmt, dtype, path, name, cache_dir)
        with staged_file(digest_file) as staging:
            staging.write_text(sha256_file(path))
    return ExportedBase(path, filename, MEDIA_TYPES[fmt], digest_file.read_text().strip())


def _export(model_dir: Path, fmt: str, dtype: str, path: Path, name: str,
            cache_dir: Path | None) -> None:
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
            capture_output=True, text=True, env=env, check=False)
        if child.returncode != 0:
            lines = child.stderr.strip().splitlines() or [f"exit code {child.returncode}"]
            raise BaseExportFailed(lines[-1].removeprefix("mebp: error: "))
        if fmt == "gguf":
            os.replace(out, path)  # the child wrote and fsynced it whole
        else:
            with staged_file(path) as staging:  # weights do not compress: stored, not deflated
                zip_directory(out, staging, top=name, compression=zipfile.ZIP_STORED)
    finally:
        shutil.rmtree(work, ignore_errors=True)
