"""Trained preset weights that ship inside the package, as packed stores.

A shipped preset's weights are the dequantized values of its store in
``mebp_core/store/shipped/<name>/``: packing it again re-quantizes those values, so any quant
and group size a user asks for is made from them, and int4 with the shipped group size
reproduces the shipped arrays. The store's sha256 identifies the weights (caches key on it).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from mebp_core.store.errors import StoreError
from mebp_core.store.format import STORE_FILENAME

if TYPE_CHECKING:
    import torch

SHIPPED_DIR = Path(__file__).parent / "shipped"


def shipped_store_dir(name: str) -> Path:
    return SHIPPED_DIR / name


def shipped_sha256(name: str) -> str:
    path = shipped_store_dir(name) / STORE_FILENAME
    try:
        st = path.stat()
    except FileNotFoundError:
        raise StoreError(f"{path}: the shipped weights of preset {name!r} are missing") from None
    return _file_sha256(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    """Cached per (path, size, mtime), so a replaced file is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def iter_shipped_rows(
    name: str, tensor_name: str, dtype: torch.dtype, chunk_rows: int
) -> Iterator[torch.Tensor]:
    """The dequantized rows of one shipped tensor, `chunk_rows` at a time."""
    from mebp_core.store.reader import open_store  # torch: not for the key (shipped_sha256)

    with open_store(shipped_store_dir(name)) as store:
        if tensor_name not in store:
            raise StoreError(f"{store.file}: the shipped preset {name!r} has no {tensor_name!r}")
        rows = store.info(tensor_name).shape[0]
        for start in range(0, rows, chunk_rows):
            yield store.dequantize(tensor_name, dtype, rows=slice(start, start + chunk_rows))
