"""Process-wide settings of the C runtime: tying a process's life to its parent's (Linux
``PR_SET_PDEATHSIG``), and glibc's malloc arenas."""

from __future__ import annotations

import ctypes
import os

PR_SET_PDEATHSIG = 1  # linux/prctl.h
M_ARENA_MAX = -8  # malloc.h


def die_with_parent(signal_number: int, parent_pid: int | None = None) -> None:
    """Have the kernel send ``signal_number`` to this process when its parent exits; if the
    parent (``parent_pid``) is already gone, send it now."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal_number))
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal_number)


def use_one_malloc_arena() -> None:
    """Cap glibc's malloc arenas at one (no-op where the C library is not glibc): a thread
    started after this shares the arena the main thread frees into. A thread that already
    has an arena keeps it, so call this at an engine process's start, before its threads.

    MKL's float32 matmuls allocate their packing buffers on torch's worker thread, whose own
    arena the main thread never reuses (BENCHMARKS: "One malloc arena")."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_ARENA_MAX, 1)
