"""The staging buffers' geometry for direct reads (``direct``), torch-free for the planner."""

from __future__ import annotations

# O_DIRECT wants file offsets, lengths and buffer addresses aligned to the device's logical
# block; a page is a multiple of every one in use
ALIGN_BYTES = 4096
# a staging buffer's least size, for models whose blocks are smaller than a useful run of
# head rows (runs of the head are read in line only at each sweep's start)
MIN_ROWS_BYTES = 1 << 20


def aligned(start: int, end: int) -> tuple[int, int]:
    """The aligned cover of the file's bytes [start, end)."""
    return start // ALIGN_BYTES * ALIGN_BYTES, -(-end // ALIGN_BYTES) * ALIGN_BYTES


def staged_nbytes(ranges: tuple[tuple[int, int], ...]) -> int:
    """Staging bytes a unit of these file ranges takes: each range's aligned cover."""
    return sum(b - a for a, b in (aligned(*r) for r in ranges))
