"""The ``--metrics`` JSONL file: one line per step."""

from __future__ import annotations

import json
import os
from pathlib import Path


def keep_steps_through(path: Path, last_step: int) -> None:
    """Cut the file back to the lines of steps up to ``last_step`` (nothing for 0), as a run
    resumed from that step's checkpoint needs before appending: then every step appears once.
    A line cut short by a crash goes too. Replaced whole, so a reader never sees half."""
    if not path.exists():
        return
    kept = [line for line in path.read_bytes().splitlines(keepends=True)
            if line.strip() and line.endswith(b"\n") and json.loads(line)["step"] <= last_step]
    staging = path.with_name(path.name + ".tmp")
    staging.write_bytes(b"".join(kept))
    os.replace(staging, path)


def read_steps(path: Path) -> list[dict]:
    """Every step's metrics in the file, in order (none if it was never written)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
