"""The ``model.mebp`` file layout: preamble, JSON header, 64-byte aligned arrays.

Layout: 8-byte magic ``MEBPSTOR``, u32 format version, u64 header length (all little
endian), the UTF-8 JSON header, zero padding, then the data section. Every array offset in
the header is relative to the data section, which starts at the first 64-byte boundary after
the header, so the header can be written before any data exists.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mebp_core.store.errors import StoreFormatError

MAGIC = b"MEBPSTOR"
FORMAT_VERSION = 1
ALIGN_BYTES = 64
STORE_FILENAME = "model.mebp"
QUANT_BITS = {"none": None, "int8": 8, "int4": 4}
_PREAMBLE = struct.Struct("<8sIQ")

# the dtypes an unquantized array may be stored as, by the name the header gives, and the
# bytes an element of each takes (``dtypes.DTYPES`` maps the names to torch's)
ITEMSIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
             "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def align_up(n_bytes: int, align_bytes: int = ALIGN_BYTES) -> int:
    return (n_bytes + align_bytes - 1) // align_bytes * align_bytes


@dataclass(frozen=True)
class ArraySpan:
    offset_bytes: int  # from the start of the data section
    nbytes: int


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str  # the source dtype; what an unquantized tensor is stored as
    bits: int | None
    data: ArraySpan
    scales: ArraySpan | None = None
    biases: ArraySpan | None = None

    @property
    def nbytes(self) -> int:
        spans = (self.data, self.scales, self.biases)
        return sum(span.nbytes for span in spans if span is not None)

    def to_json(self) -> dict[str, Any]:
        def span(s: ArraySpan | None):
            return None if s is None else {"offset_bytes": s.offset_bytes, "nbytes": s.nbytes}

        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "bits": self.bits,
            "data": span(self.data),
            "scales": span(self.scales),
            "biases": span(self.biases),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TensorEntry:
        def span(s):
            return None if s is None else ArraySpan(int(s["offset_bytes"]), int(s["nbytes"]))

        return cls(
            obj["name"],
            tuple(obj["shape"]),
            obj["dtype"],
            obj["bits"],
            span(obj["data"]),
            span(obj["scales"]),
            span(obj["biases"]),
        )


def plan_tensors(
    specs: list[tuple[str, tuple[int, ...], str, int | None]], group_size: int
) -> tuple[list[TensorEntry], int]:
    """Place every (name, shape, dtype, bits) array in the data section; returns entries and
    the data section's size in bytes."""
    entries, cursor = [], 0

    def place(nbytes: int) -> ArraySpan:
        nonlocal cursor
        span = ArraySpan(cursor, nbytes)
        cursor = align_up(cursor + nbytes)
        return span

    for name, shape, dtype, bits in specs:
        if bits is None:
            n_elements = 1
            for dim in shape:
                n_elements *= dim
            span = place(n_elements * ITEMSIZES[dtype])
            entries.append(TensorEntry(name, tuple(shape), dtype, None, span))
            continue
        n_rows, k = shape
        data = place(n_rows * k * bits // 8)
        scales = place(n_rows * (k // group_size) * 2)
        biases = place(n_rows * (k // group_size) * 2)
        entries.append(TensorEntry(name, tuple(shape), dtype, bits, data, scales, biases))
    return entries, cursor


def encode_header(header: dict[str, Any]) -> tuple[bytes, int]:
    """Preamble + JSON + padding; returns the bytes and the data section's file offset."""
    body = json.dumps(header, separators=(",", ":")).encode()
    head = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(body)) + body
    data_offset_bytes = align_up(len(head))
    return head + b"\0" * (data_offset_bytes - len(head)), data_offset_bytes


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """Read and validate the header; returns it and the data section's file offset."""
    file_nbytes = os.path.getsize(path)
    with open(path, "rb") as f:
        preamble = f.read(_PREAMBLE.size)
        if len(preamble) < _PREAMBLE.size:
            raise StoreFormatError(f"{path}: truncated store ({file_nbytes} bytes, no header)")
        magic, version, header_nbytes = _PREAMBLE.unpack(preamble)
        if magic != MAGIC:
            raise StoreFormatError(f"{path}: not a mebp store (magic {magic!r} != {MAGIC!r})")
        if version != FORMAT_VERSION:
            raise StoreFormatError(
                f"{path}: unsupported store format version {version} "
                f"(this reader knows version {FORMAT_VERSION}); repack the model"
            )
        if _PREAMBLE.size + header_nbytes > file_nbytes:
            raise StoreFormatError(f"{path}: truncated store (header runs past end of file)")
        try:
            header = json.loads(f.read(header_nbytes))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreFormatError(f"{path}: corrupt store header ({exc})") from exc
    data_offset_bytes = align_up(_PREAMBLE.size + header_nbytes)
    needed_nbytes = data_offset_bytes + int(header.get("data_nbytes", 0))
    if file_nbytes < needed_nbytes:
        raise StoreFormatError(
            f"{path}: truncated store ({file_nbytes} bytes, header promises {needed_nbytes})"
        )
    return header, data_offset_bytes
