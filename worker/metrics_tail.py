"""Reading the lines a running process appends to a JSONL file, each complete line once."""

from __future__ import annotations

import json
import os
from pathlib import Path


class MetricsTail:
    def __init__(self, path: Path, *, start_at_end: bool = False) -> None:
        self.path = path
        self.offset = path.stat().st_size if start_at_end and path.exists() else 0

    def read_new(self) -> list[dict]:
        """The complete lines written since the last call (a half-written one waits)."""
        try:
            with open(self.path, "rb") as file:
                file.seek(self.offset)
                chunk = file.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]


def keep_metrics_through(path: Path, step: int) -> None:
    """Cut a metrics file back to the lines of steps up to ``step`` (all of it for 0), as a
    resumed run does, before anyone tails it."""
    if not path.exists():
        return
    kept = [line for line in path.read_bytes().splitlines(keepends=True)
            if line.strip() and line.endswith(b"\n") and json.loads(line)["step"] <= step]
    staging = path.with_name(path.name + ".tmp")
    staging.write_bytes(b"".join(kept))
    os.replace(staging, path)
