"""Memory-mapped access to a packed model: opening it copies no weights into memory."""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mebp_core.store.dtypes import DTYPES
from mebp_core.store.errors import StoreError, StoreFormatError
from mebp_core.store.format import STORE_FILENAME, ArraySpan, TensorEntry, read_header
from mebp_core.store.quant import dequantize


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: torch.dtype  # the source dtype
    bits: int | None  # None when stored unquantized
    nbytes: int  # bytes the packed arrays occupy in the file


@dataclass(frozen=True)
class RawTensor:
    """Views onto the mapping: packed ``data`` (or the plain tensor) and float16 factors."""

    data: torch.Tensor
    scales: torch.Tensor | None
    biases: torch.Tensor | None
    bits: int | None


class PackedStore:
    """A packed model directory. Tensors are views onto a private (copy-on-write) mapping of
    ``model.mebp``, so pages are read lazily by the kernel and can be dropped under pressure."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = self.path / STORE_FILENAME
        if not self.file.is_file():
            raise StoreError(f"{self.path}: not a packed model (no {STORE_FILENAME})")
        header, data_offset_bytes = read_header(self.file)
        self.header: dict[str, Any] = header
        self.quant: str = header["quant"]
        self.group_size: int = int(header["group_size"])
        self.name_prefix_map: dict[str, str] = header.get("name_prefix_map", {})
        self.config: dict[str, Any] = _read_config(self.path)
        self._entries = {e["name"]: TensorEntry.from_json(e) for e in header["tensors"]}
        with open(self.file, "rb") as f:
            # ACCESS_COPY gives a writable buffer (torch.frombuffer warns on read-only ones)
            # while staying file-backed: nothing is copied unless someone writes to a page.
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._bytes = torch.frombuffer(self._mmap, dtype=torch.uint8)
        self._data_offset_bytes = data_offset_bytes
        self._raw: dict[str, RawTensor] = {}

    def __enter__(self) -> PackedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def _entry(self, name: str) -> TensorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise StoreError(f"{self.file}: no tensor named {name!r}") from None

    def info(self, name: str) -> TensorInfo:
        e = self._entry(name)
        return TensorInfo(e.shape, DTYPES[e.dtype], e.bits, e.nbytes)

    def _span_bytes(self, span: ArraySpan, window: torch.Tensor | None = None,
                    window_start: int = 0) -> torch.Tensor:
        """``span``'s bytes on the mapping, or on ``window``: a copy of the file's bytes
        from ``window_start`` on."""
        if window is None:
            if self._bytes is None:
                raise StoreError(f"{self.file}: store is closed")
            window = self._bytes
        start = self._data_offset_bytes + span.offset_bytes - window_start
        return window[start : start + span.nbytes]

    def _raw_of(self, e: TensorEntry, n_rows: int | None, arrays: list[torch.Tensor]
                ) -> RawTensor:
        """``e`` (or ``n_rows`` of its rows) over its arrays' bytes: data, then scales and
        biases when quantized."""
        if e.bits is None:
            shape = e.shape if n_rows is None else (n_rows, *e.shape[1:])
            return RawTensor(arrays[0].view(DTYPES[e.dtype]).view(shape), None, None, None)
        n_rows = e.shape[0] if n_rows is None else n_rows
        groups = (n_rows, e.shape[1] // self.group_size)
        return RawTensor(arrays[0].view(n_rows, e.shape[1] * e.bits // 8),
                         arrays[1].view(torch.float16).view(groups),
                         arrays[2].view(torch.float16).view(groups), e.bits)

    def raw(self, name: str) -> RawTensor:
        """The packed arrays as zero-copy views: (N, K*bits/8) uint8 data and (N, K/g)
        float16 scales/biases, or the plain tensor when stored unquantized."""
        if name not in self._raw:
            self._raw[name] = self.raw_in(name)
        return self._raw[name]

    def raw_in(self, name: str, window: torch.Tensor | None = None,
               window_start: int = 0) -> RawTensor:
        """``raw``'s views, onto ``window`` (a copy of the file's bytes from
        ``window_start``, covering ``file_span(name)``) when given."""
        e = self._entry(name)
        spans = [span for span in (e.data, e.scales, e.biases) if span is not None]
        return self._raw_of(e, None,
                            [self._span_bytes(span, window, window_start) for span in spans])

    def file_span(self, name: str) -> tuple[int, int]:
        """The file's bytes [start, end) holding every array of ``name``."""
        e = self._entry(name)
        spans = [s for s in (e.data, e.scales, e.biases) if s is not None]
        return (self._data_offset_bytes + min(s.offset_bytes for s in spans),
                self._data_offset_bytes + max(s.offset_bytes + s.nbytes for s in spans))

    def row_spans(self, name: str, rows: slice) -> list[tuple[int, int]]:
        """The file's bytes [start, end) holding rows ``rows`` (step 1) of each of
        ``name``'s arrays: data, then scales and biases when quantized."""
        e = self._entry(name)
        start, stop, _ = rows.indices(e.shape[0])
        out = []
        for span in (e.data, e.scales, e.biases):
            if span is not None:
                row_nbytes = span.nbytes // e.shape[0]
                first = self._data_offset_bytes + span.offset_bytes
                out.append((first + start * row_nbytes, first + stop * row_nbytes))
        return out

    def raw_rows(self, name: str, rows: slice, arrays: list[torch.Tensor]) -> RawTensor:
        """``raw``'s views for rows ``rows`` alone, over ``arrays``: the bytes of
        ``row_spans(name, rows)``, in order."""
        e = self._entry(name)
        return self._raw_of(e, len(range(e.shape[0])[rows]), arrays)

    def dequantize(
        self,
        name: str,
        dtype: torch.dtype = torch.float32,
        rows: slice | None = None,
        out: torch.Tensor | None = None,
        cols: slice | None = None,
        values: torch.dtype | None = None,
    ) -> torch.Tensor:
        """A new tensor (or ``out``) holding the requested rows and columns (all when None;
        columns a step-1 slice) in ``dtype``, with the values of ``values`` when narrower
        (see ``quant.dequantize``)."""
        return self.dequantize_raw(self.raw(name), dtype, rows, out, cols, values)

    def dequantize_raw(self, raw: RawTensor, dtype: torch.dtype, rows: slice | None,
                       out: torch.Tensor | None, cols: slice | None,
                       values: torch.dtype | None) -> torch.Tensor:
        """``dequantize`` of arrays in hand (``raw``'s, or copies of them)."""
        if raw.bits is None:
            src = raw.data if rows is None else raw.data[rows]
            src = src if cols is None else src[:, cols]
            if values is not None and values != src.dtype:
                src = src.to(values)
            if out is None:
                return src.to(dtype, copy=True)
            return out.copy_(src)
        return dequantize(raw.data, raw.scales, raw.biases, raw.bits, self.group_size, dtype,
                          out=out, rows=rows, cols=cols, values=values)

    def gather_rows(
        self, name: str, index: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Embedding lookup: rows ``index`` (any shape) -> index.shape + (K,), decompressing
        only those rows."""
        raw = self.raw(name)
        flat = index.reshape(-1).to(torch.long)
        if raw.bits is None:
            rows = raw.data.index_select(0, flat).to(dtype)
        else:
            rows = dequantize(
                raw.data, raw.scales, raw.biases, raw.bits, self.group_size, dtype, rows=flat
            )
        return rows.view(*index.shape, rows.shape[-1])

    def close(self) -> None:
        """Forget the mapping: later calls raise ``StoreError``. It is never unmapped here:
        ``torch.frombuffer`` holds a reference to the mmap object but no buffer export, so
        ``mmap.close()`` would unmap memory that views handed out by ``raw`` still point at.
        The kernel unmaps it when the last of them is gone."""
        self._raw.clear()
        self._bytes = None
        self._mmap = None


def _read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    try:
        return json.loads(config_file.read_text())
    except FileNotFoundError:
        raise StoreError(f"{config_file}: missing from packed model") from None
    except json.JSONDecodeError as exc:
        raise StoreFormatError(f"{config_file}: invalid JSON ({exc})") from exc


def open_store(path: str | Path) -> PackedStore:
    return PackedStore(Path(path))
