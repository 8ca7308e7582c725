"""The files an adapter downloads as, one per format, made once and kept beside it (in
``<adapter>-downloads/``): the PEFT folder zipped, the MLX export zipped, the GGUF export.
Each is written atomically, then its sha256 beside it (``<file>.sha256``); a digest found
always names the file it sits by, so a download serves a file from disk with the sha256 of
exactly its bytes, the same bytes download after download.

A job's worker makes the PEFT zip as it records the adapter (its digest is the adapter's);
any other format, or an adapter kept before, is made by its first download, one maker at a
time across processes (the others wait for it and serve its file). A maker that holds the
turn past ``MAKER_WAIT_S`` hangs (a lost attempt's stopped worker keeps its lock for good):
the file is then made anyway, which is safe because every write is atomic and an adapter's
folder always gives the same bytes in each format (so should the hung maker wake and finish,
its file and digest name the same bytes). An adapter folder gone (a
checkpoint pruned while it was asked for) is an ``AdapterGoneError``, its downloads folder
left removed; a file opened (``open_adapter_file``) is served whole even if pruned after.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from mebp_core.atomic import try_lock
from mebp_core.lora.peft_files import AdapterError
from service.storage import adapter_downloads_dir, kept_digest, write_with_digest, zip_directory

AdapterFormat = Literal["peft", "mlx", "gguf"]
# format: (what follows a name: the file kept, "adapter<suffix>", and the download's
# "<stem><suffix>"), media type
FORMATS: dict[str, tuple[str, str]] = {"peft": ("-peft.zip", "application/zip"),
                                       "mlx": ("-mlx.zip", "application/zip"),
                                       "gguf": (".gguf", "application/octet-stream")}
MAKER_WAIT_S = 30.0  # a LoRA adapter zips or exports in a second or two


class AdapterGoneError(FileNotFoundError):
    """The adapter's folder is no longer there: a checkpoint pruned meanwhile."""


@dataclass(frozen=True)
class AdapterFile:
    path: Path
    sha256: str  # of the file's bytes
    fmt: AdapterFormat

    @property
    def media_type(self) -> str:
        return FORMATS[self.fmt][1]

    def download_name(self, stem: str) -> str:
        return stem + FORMATS[self.fmt][0]


def adapter_file(source: Path, fmt: AdapterFormat, base_config: dict | None, *,
                 remake: bool = False) -> AdapterFile:
    """The adapter in ``source`` as ``fmt``: the kept file, or made now (``remake``: made
    now whatever is kept). ``base_config``, the base model's HF config, is needed to export
    mlx and gguf."""
    path = adapter_downloads_dir(source) / f"adapter{FORMATS[fmt][0]}"
    kept = None if remake else _kept(path, fmt)
    if kept is not None:
        return kept
    if not source.is_dir():  # before the lock, whose file would make its folder again
        raise AdapterGoneError(f"no adapter at {source}")
    with try_lock(path.with_name(f".{path.name}.lock"), wait_s=MAKER_WAIT_S):
        try:
            if not source.is_dir():  # renamed away (pruned) while this one waited
                raise AdapterGoneError(f"no adapter at {source}")
            kept = None if remake else _kept(path, fmt)  # made while this one waited
            return kept or _make(source, fmt, base_config, path)
        except (OSError, AdapterError) as exc:
            if source.is_dir():
                raise
            shutil.rmtree(path.parent, ignore_errors=True)  # the lock made it again
            raise AdapterGoneError(f"no adapter at {source}") from exc


def open_adapter_file(source: Path, fmt: AdapterFormat,
                      base_config: dict | None) -> tuple[AdapterFile, BinaryIO]:
    """``adapter_file``'s file, opened: its bytes stay readable whole even if the adapter
    is pruned before they are all read (Linux frees them once the file is closed)."""
    kept = adapter_file(source, fmt, base_config)
    try:
        return kept, open(kept.path, "rb")  # noqa: SIM115  (closed once it is served)
    except FileNotFoundError:
        if source.is_dir():
            raise
        raise AdapterGoneError(f"no adapter at {source}") from None


def _kept(path: Path, fmt: AdapterFormat) -> AdapterFile | None:
    digest = kept_digest(path)
    return AdapterFile(path, digest, fmt) if digest is not None and path.is_file() else None


def _make(source: Path, fmt: AdapterFormat, base_config: dict | None,
          path: Path) -> AdapterFile:
    if fmt == "peft":
        digest = write_with_digest(path, lambda staging: zip_directory(source, staging))
    else:
        digest = write_with_digest(
            path, lambda staging: _export(source, fmt, base_config, staging))
    return AdapterFile(path, digest, fmt)


def _export(source: Path, fmt: AdapterFormat, base_config: dict | None,
            staging: Path) -> None:
    if base_config is None:
        raise ValueError(f"exporting an adapter as {fmt} needs its base model's config")
    with tempfile.TemporaryDirectory(prefix=".export-", dir=staging.parent) as tmp:
        from mebp_core.lora.export import export_adapter  # torch: loaded by a first export

        out = export_adapter(source, fmt, Path(tmp) / fmt, base_config=base_config)
        if fmt == "gguf":
            os.replace(out, staging)
        else:
            zip_directory(out, staging)

