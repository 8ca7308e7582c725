"""Load on this host's cores, for tests of what the product does on a busy machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def all_cores_but_one_busy() -> Iterator[None]:
    """Every core of this host but one kept busy, by spinning processes, while inside."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range((os.cpu_count() or 1) - 1)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()
