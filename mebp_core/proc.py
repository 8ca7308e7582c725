"""Tying a process's life to its parent's (Linux ``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import ctypes
import os

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(signal_number: int, parent_pid: int | None = None) -> None:
    """Have the kernel send ``signal_number`` to this process when its parent exits; if the
    parent (``parent_pid``) is already gone, send it now."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal_number))
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal_number)
