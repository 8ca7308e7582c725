"""A packed model read with ``O_DIRECT`` into two reused staging buffers, one unit ahead.

Under a memory cap with no room for the store's pages beside the step, a mapped store is
read again every step through page faults, each of them first making room under the cap.
Direct reads skip the page cache: the disk's bytes land in one of two staging buffers
(anonymous memory, counted like any tensor), a thread reads the next unit while the current
one is dequantized, and no page is cached, charged or reclaimed. The bytes are the file's,
so every weight dequantizes to the same values as through the mapping.

A unit is a block (every tensor of ``model.layers.<i>``, one run of the file) or rows of a
weight outside the blocks (the output head's vocabulary tiles). The next unit is guessed
from the order the passes visit them: blocks forward then back, a weight's rows in sweeps of
the same length. A wrong guess costs one read in line, counted in ``ReadStats``.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from mebp_core.store.errors import StoreError
from mebp_core.store.reader import PackedStore
from mebp_core.store.staging import ALIGN_BYTES, MIN_ROWS_BYTES, aligned, staged_nbytes


@dataclass(frozen=True)
class Unit:
    key: tuple
    ranges: tuple[tuple[int, int], ...]  # the file's bytes [start, end) it needs, in order


@dataclass
class ReadStats:
    units_read: int = 0
    bytes_read: int = 0
    in_line_reads: int = 0  # units the step waited for in full: no read ahead had them
    wait_s: float = 0.0  # time the step spent waiting for reads, in line or ahead


class StagingBuffer:
    """A page-aligned anonymous mapping the disk reads into, and which unit it holds."""

    def __init__(self, nbytes: int) -> None:
        # never close()d: views handed out keep the mmap object, unmapped with the last one
        self._mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.bytes = torch.frombuffer(self._mapping, dtype=torch.uint8)
        self.unit: Unit | None = None
        self.arrays: list[torch.Tensor] = []

    def forget(self) -> None:
        """Hold no unit: done by the thread that hands the buffer to a read, before it."""
        self.unit, self.arrays = None, []

    def fill(self, fd: int, unit: Unit, path: Path) -> int:
        """Read ``unit``'s ranges into this buffer, one after another; the bytes read. The
        buffer holds ``unit`` once every range is in."""
        view, position, arrays = memoryview(self._mapping), 0, []
        for start, end in unit.ranges:
            first, last = aligned(start, end)
            _read_exactly(fd, view[position:position + last - first], first, end - first,
                          path)
            offset = position + start - first
            arrays.append(self.bytes[offset:offset + end - start])
            position += last - first
        self.unit, self.arrays = unit, arrays
        return position


def _read_exactly(fd: int, into: memoryview, offset: int, needed: int, path: Path) -> None:
    """At least ``needed`` bytes from ``offset`` into ``into``. A read that stops short of an
    aligned end is the file's end (a direct read cannot go on from there)."""
    done = 0
    while done < needed:
        n = os.preadv(fd, [into[done:]], offset + done)
        done += n
        if n == 0 or (done < needed and n % ALIGN_BYTES):
            raise StoreError(f"{path}: truncated store (it ends before byte "
                             f"{offset + needed})")


class StagedReader:
    """Two staging buffers over one file: the unit in use, and the next one being read by a
    thread while the first is used. A unit too large for a buffer is the caller's to split."""

    def __init__(self, path: Path, capacity_bytes: int) -> None:
        self.path = path
        self.capacity_bytes = -(-capacity_bytes // ALIGN_BYTES) * ALIGN_BYTES
        self.fd, self.direct = _open_direct(path)
        self._buffers: list[StagingBuffer] = []  # made on first use, until ``release``
        self._current: StagingBuffer | None = None
        self._pending: tuple[StagingBuffer, Unit, Future] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.stats = ReadStats()

    def stage(self, unit: Unit, then: Unit | None) -> list[torch.Tensor]:
        """``unit``'s ranges as tensors over a staging buffer, valid until the next call;
        ``then`` (the unit expected next) is read meanwhile."""
        if self.fd < 0:
            raise StoreError(f"{self.path}: store is closed")
        # a buffer being read into holds no unit until the read is done
        held = next((b for b in self._buffers if b.unit == unit), None)
        start = time.perf_counter()
        if self._pending is not None and self._pending[1] == unit:
            held = self._settle_pending()
        elif held is None:
            self._settle_pending()  # its buffer is the one to read into
            held = self._free_buffer()
            held.forget()
            self._fill(held, unit)
            self.stats.in_line_reads += 1
        self.stats.wait_s += time.perf_counter() - start
        self._current = held
        if then is not None and then != unit and all(b.unit != then for b in self._buffers):
            self._read_ahead(then)
        return held.arrays

    def _free_buffer(self) -> StagingBuffer:
        if not self._buffers:
            self._buffers = [StagingBuffer(self.capacity_bytes) for _ in range(2)]
        return next(b for b in self._buffers if b is not self._current)

    def _fill(self, buffer: StagingBuffer, unit: Unit) -> None:
        needed = staged_nbytes(unit.ranges)
        if needed > self.capacity_bytes:
            raise ValueError(f"unit {unit.key} needs {needed} bytes, the staging buffers "
                             f"hold {self.capacity_bytes}")
        try:
            self.stats.bytes_read += buffer.fill(self.fd, unit, self.path)
        except OSError as exc:
            raise StoreError(f"{self.path}: read failed ({exc})") from exc
        self.stats.units_read += 1
        if not self.direct:  # plain reads: leave nothing behind in the page cache
            for start, end in unit.ranges:
                os.posix_fadvise(self.fd, start, end - start, os.POSIX_FADV_DONTNEED)

    def _read_ahead(self, unit: Unit) -> None:
        if self._pending is not None:
            return  # one read ahead at a time: the other buffer is the one in use
        buffer = self._free_buffer()
        buffer.forget()  # here, before the thread starts: ``stage`` must not see it held
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="mebp-store-read")
        self._pending = (buffer, unit, self._executor.submit(self._fill, buffer, unit))

    def _settle_pending(self) -> StagingBuffer | None:
        """Wait for the read ahead, if any; the buffer it filled."""
        if self._pending is None:
            return None
        buffer, _, future = self._pending
        self._pending = None
        future.result()
        return buffer

    def _drop_pending(self) -> None:
        """Wait for the read ahead, if any, and forget it: nothing asked for it yet, so a
        failure of it is no one's."""
        if self._pending is not None:
            self._pending[2].exception()  # waits for it
            self._pending = None

    def release(self) -> None:
        """Give the staging buffers back (remade at the next read): for a model whose
        weights were all kept decompressed while loading."""
        self._drop_pending()
        self._buffers, self._current = [], None

    def close(self) -> None:
        """Stop reading."""
        self._drop_pending()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._buffers, self._current = [], None


def _open_direct(path: Path) -> tuple[int, bool]:
    """The file opened for ``O_DIRECT`` reads, or for plain ones where its filesystem has
    none (tmpfs before Linux 6.6, some FUSE filesystems)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT), True
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise StoreError(f"{path}: cannot open for reading ({exc})") from exc
    return os.open(path, os.O_RDONLY), False


class DirectReadStore(PackedStore):
    """A packed store whose ``dequantize`` reads through a ``StagedReader``: a block at a
    time for the blocks' matrices, and rows in bounded runs for the rest. Through the
    mapping still: row lookups (``gather_rows``: the embedding's rows, the loss's target
    rows of the head, a few a step) and vectors (norms and biases, read once at load)."""

    def __init__(self, path: Path, block_of: Callable[[str], int]) -> None:
        """``block_of``: the block a tensor name belongs to, or -1."""
        super().__init__(path)
        self._block_of = block_of
        self._block_units = block_units(self, block_of)
        self._direction = 1
        self._last_block: int | None = None
        largest_block = max((staged_nbytes(u.ranges) for u in self._block_units.values()),
                            default=0)
        self.reader = StagedReader(self.file, max(largest_block, MIN_ROWS_BYTES))

    def dequantize(self, name: str, dtype: torch.dtype = torch.float32,
                   rows: slice | None = None, out: torch.Tensor | None = None,
                   cols: slice | None = None, values: torch.dtype | None = None
                   ) -> torch.Tensor:
        if len(self.info(name).shape) != 2:
            return super().dequantize(name, dtype, rows, out, cols, values)
        block = self._block_of(name)
        if block >= 0:
            (window,) = self.reader.stage(self._block_units[block], self._next_block(block))
            raw = self.raw_in(name, window, self._block_units[block].ranges[0][0])
            return self.dequantize_raw(raw, dtype, rows, out, cols, values)
        return self._dequantize_rows(name, dtype, rows, out, cols, values)

    def _next_block(self, block: int) -> Unit | None:
        """The block the passes visit after ``block``: onward in the direction they go, back
        the other way at either end."""
        if self._last_block is not None and block != self._last_block:
            self._direction = 1 if block > self._last_block else -1
        self._last_block = block
        for step in (self._direction, -self._direction):
            unit = self._block_units.get(block + step)
            if unit is not None:
                return unit
        return None

    def _dequantize_rows(self, name: str, dtype: torch.dtype, rows: slice | None,
                         out: torch.Tensor | None, cols: slice | None,
                         values: torch.dtype | None) -> torch.Tensor:
        """Rows ``rows`` of a weight outside the blocks, read a run of rows at a time that
        fits a staging buffer (the whole request at once where it does). Read ahead: the
        request's next run, and after its last, the first run of a request as long just
        after it (the next vocabulary tile)."""
        n_rows, k = self.info(name).shape
        first, stop, _ = (rows or slice(None)).indices(n_rows)
        width = k if cols is None else len(range(k)[cols])
        if out is None:
            out = torch.empty(stop - first, width, dtype=dtype)
        run = min(self._rows_per_run(name), max(1, stop - first))
        for start in range(first, stop, run):
            chunk = slice(start, min(stop, start + run))
            bound = stop if chunk.stop < stop else n_rows  # this request, or the next
            then = self._rows_unit(name, slice(chunk.stop, min(bound, chunk.stop + run))) \
                if chunk.stop < n_rows else None
            arrays = self.reader.stage(self._rows_unit(name, chunk), then)
            self.dequantize_raw(self.raw_rows(name, chunk, arrays), dtype, None,
                                out[chunk.start - first:chunk.stop - first], cols, values)
        return out

    def _rows_unit(self, name: str, rows: slice) -> Unit:
        return Unit(("rows", name, rows.start, rows.stop), tuple(self.row_spans(name, rows)))

    def _rows_per_run(self, name: str) -> int:
        """The most rows of ``name`` whose arrays' aligned covers fit a staging buffer."""
        spans = self.row_spans(name, slice(0, 1))
        row_nbytes = sum(end - start for start, end in spans)
        slack = 2 * ALIGN_BYTES * len(spans)  # each array's cover rounds out at both ends
        return max(1, (self.reader.capacity_bytes - slack) // row_nbytes)

    @property
    def read_stats(self) -> ReadStats:
        return self.reader.stats

    def close(self) -> None:
        try:
            self.reader.close()
        finally:
            super().close()


def block_units(store: PackedStore, block_of: Callable[[str], int]) -> dict[int, Unit]:
    """Each block's unit: the run of the file from its first tensor's bytes to its last's
    (the packer writes a block's tensors together)."""
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for name in store.names():
        if (block := block_of(name)) >= 0:
            spans[block].append(store.file_span(name))
    return {block: Unit(("block", block), ((min(s for s, _ in runs), max(e for _, e in runs)),))
            for block, runs in spans.items()}


def open_direct_store(path: str | Path, block_of: Callable[[str], int]) -> DirectReadStore:
    return DirectReadStore(Path(path), block_of)
