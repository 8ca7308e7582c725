"""Reading the lines a running process appends to a JSONL file, each complete line once."""

from __future__ import annotations

import json
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
