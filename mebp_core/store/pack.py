"""Packing a Hugging Face checkpoint or a preset into a store directory, streamed and atomic.

Tensors flow row chunk by row chunk from the source through quantization into their
pre-planned offsets in ``model.mebp``; the whole model is never held in memory. Everything
is written into a temporary directory next to ``out`` and renamed into place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

from mebp_core.store.checkpoint import CheckpointSource
from mebp_core.store.errors import PackError
from mebp_core.store.format import (
    QUANT_BITS,
    STORE_FILENAME,
    TensorEntry,
    encode_header,
    plan_tensors,
)
from mebp_core.store.groups import check_group_size, choose_bits
from mebp_core.store.preset_configs import PRESET_PREFIX
from mebp_core.store.presets import PresetSource
from mebp_core.store.quant import quantize

Progress = Callable[[int, int, str], None]


def open_source(src: str | Path) -> CheckpointSource | PresetSource:
    if isinstance(src, str) and src.startswith(PRESET_PREFIX):
        return PresetSource(src[len(PRESET_PREFIX) :])
    return CheckpointSource(Path(src))


def _write_bytes(f: BinaryIO, offset_bytes: int, t: torch.Tensor) -> None:
    f.seek(offset_bytes)
    f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _write_tensor(f: BinaryIO, base_bytes: int, entry: TensorEntry, source, group_size: int):
    row, plain_bytes = 0, 0
    for chunk in source.iter_rows(entry.name):
        if entry.bits is None:
            _write_bytes(f, base_bytes + entry.data.offset_bytes + plain_bytes, chunk)
            plain_bytes += chunk.nbytes
            continue
        qt = quantize(chunk, entry.bits, group_size)
        row_nbytes = entry.shape[1] * entry.bits // 8
        factor_nbytes = entry.shape[1] // group_size * 2
        _write_bytes(f, base_bytes + entry.data.offset_bytes + row * row_nbytes, qt.data)
        _write_bytes(f, base_bytes + entry.scales.offset_bytes + row * factor_nbytes, qt.scales)
        _write_bytes(f, base_bytes + entry.biases.offset_bytes + row * factor_nbytes, qt.biases)
        row += chunk.shape[0]


def _write_store(file: Path, source, quant: str, group_size: int, progress: Progress | None):
    bits = QUANT_BITS[quant]
    specs = [(n, s, d, choose_bits(s, d, bits, group_size)) for n, s, d in source.specs]
    entries, data_nbytes = plan_tensors(specs, group_size)
    header = {
        "quant": quant,
        "group_size": group_size,
        "source": source.description,
        "name_prefix_map": source.name_prefix_map,
        "skipped_tensors": source.skipped,
        "data_nbytes": data_nbytes,
        "tensors": [e.to_json() for e in entries],
    }
    head, data_offset_bytes = encode_header(header)
    with open(file, "wb") as f:
        f.write(head)
        f.truncate(data_offset_bytes + data_nbytes)
        for i, entry in enumerate(entries):
            _write_tensor(f, data_offset_bytes, entry, source, group_size)
            if progress is not None:
                progress(i + 1, len(entries), entry.name)
        f.flush()
        os.fsync(f.fileno())


def _write_config(tmp: Path, source) -> None:
    if isinstance(source, CheckpointSource):
        shutil.copyfile(source.src / "config.json", tmp / "config.json")
    else:
        (tmp / "config.json").write_text(json.dumps(source.config, indent=2))
    for extra in source.extra_files:
        shutil.copyfile(extra, tmp / extra.name)


def _move_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)
        return
    if not (out / STORE_FILENAME).is_file() and any(out.iterdir()):
        raise PackError(f"{out}: exists and is not a packed model; refusing to overwrite it")
    trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.rename(out, trash / "old")
    os.rename(tmp, out)
    shutil.rmtree(trash, ignore_errors=True)


def pack_model(
    src: str | Path,
    out: str | Path,
    quant: str = "int4",
    group_size: int = 64,
    progress: Progress | None = None,
) -> Path:
    """Pack ``src`` (a Hugging Face directory or ``preset:NAME``) into the directory ``out``."""
    if quant not in QUANT_BITS:
        raise PackError(f"unknown quant {quant!r} (known: {', '.join(QUANT_BITS)})")
    try:
        check_group_size(group_size)
    except ValueError as exc:
        raise PackError(str(exc)) from None
    out = Path(out)
    source = open_source(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would make the packed model private
        _write_config(tmp, source)
        _write_store(tmp / STORE_FILENAME, source, quant, group_size, progress)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        source.close()
    return out
