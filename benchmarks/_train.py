"""``mebp train`` as a benchmark child: its command line and what its metrics file says."""

from __future__ import annotations

import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEBP = REPO / ".venv" / "bin" / "mebp"


def train_argv(preset: str, data: Path, out: Path, metrics: Path, *, steps: int, seq_len: int,
               dtype: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [str(MEBP), "train", "--model", f"preset:{preset}", "--data", str(data),
            "--out", str(out), "--steps", str(steps), "--seq-len", str(seq_len),
            "--compute-dtype", dtype, "--metrics", str(metrics), *extra]


def timed_step_s(steps: list[dict]) -> float | None:
    """The median step time after the warm-up step (the only step if there is one)."""
    times = [s["step_time_s"] for s in steps[1:]] or [s["step_time_s"] for s in steps]
    return statistics.median(times) if times else None
