"""Block-input checkpoints: the only activations MeBP keeps between forward and backward."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


class _PeakCounter:
    """``peak_nbytes``: the most checkpoint bytes held at once since ``reset_peak``."""

    peak_nbytes = 0

    def reset_peak(self) -> None:
        self.peak_nbytes = self.nbytes

    def _count(self) -> None:
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)


class RamCheckpoints(_PeakCounter):
    """Block inputs kept as tensors in process memory."""

    def __init__(self) -> None:
        self._saved: dict[int, torch.Tensor] = {}

    def reserve(self, blocks: int, like: torch.Tensor) -> None:
        """Nothing to preallocate in RAM."""

    def put(self, block: int, hidden: torch.Tensor) -> None:
        self._saved[block] = hidden
        self._count()

    def pop(self, block: int) -> torch.Tensor:
        return self._saved.pop(block)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._saved.values())

    def clear(self) -> None:
        self._saved.clear()

    def close(self) -> None:
        self.clear()


class MmapCheckpoints(_PeakCounter):
    """Block inputs written to a memory-mapped file in ``directory``: file-backed pages the
    kernel can write back and evict, instead of anonymous memory. The directory must be on
    disk (on a tmpfs such as the usual temp dir the pages would be shared memory, charged
    and unreclaimable like anonymous memory). The file is unlinked at once, so nothing is
    left behind even if the process dies. A popped input is a view of its slot, never a
    copy: it stays file-backed until the next forward writes the slot again."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._buffer: torch.Tensor | None = None
        self._slot_numel = 0
        self._shapes: dict[int, torch.Size] = {}

    def _ensure(self, blocks: int, hidden: torch.Tensor) -> None:
        if self._buffer is not None and self._buffer.dtype == hidden.dtype \
                and self._slot_numel == hidden.numel() and self._buffer.shape[0] >= blocks:
            return
        self.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="mebp-ckpt-", dir=self.directory)
        try:
            nbytes = blocks * hidden.numel() * hidden.element_size()
            os.ftruncate(fd, nbytes)
            flat = torch.from_file(name, shared=True, size=blocks * hidden.numel(),
                                   dtype=hidden.dtype)
        finally:
            os.close(fd)
            os.unlink(name)
        self._buffer = flat.view(blocks, hidden.numel())
        self._slot_numel = hidden.numel()

    def reserve(self, blocks: int, like: torch.Tensor) -> None:
        self._ensure(blocks, like)

    def put(self, block: int, hidden: torch.Tensor) -> None:
        if self._buffer is None:
            raise RuntimeError("MmapCheckpoints.reserve() must be called before put()")
        self._buffer[block].copy_(hidden.reshape(-1))
        self._shapes[block] = hidden.shape
        self._count()

    def pop(self, block: int) -> torch.Tensor:
        shape = self._shapes.pop(block)
        return self._buffer[block].view(shape)

    @property
    def nbytes(self) -> int:
        if self._buffer is None:
            return 0
        return len(self._shapes) * self._slot_numel * self._buffer.element_size()

    def clear(self) -> None:
        self._shapes.clear()

    def close(self) -> None:
        self._buffer = None
        self._shapes.clear()


def make_checkpoints(storage: str, directory: str | Path | None = None):
    """``directory``: where memory-mapped checkpoints go (mmap only, and then required)."""
    if storage == "ram":
        return RamCheckpoints()
    if storage == "mmap":
        if directory is None:
            raise ValueError("memory-mapped checkpoints need a directory on disk")
        return MmapCheckpoints(directory)
    raise ValueError(f"checkpoint_storage: unknown value {storage!r} (ram or mmap)")
