"""``mebp train`` as a benchmark child: its command line and what its metrics file says."""

from __future__ import annotations

import argparse
from pathlib import Path

from mebp_core.plan.correction import steady_step_time

REPO = Path(__file__).resolve().parents[1]
MEBP = REPO / ".venv" / "bin" / "mebp"


def train_argv(preset: str, data: Path, out: Path, metrics: Path, *, steps: int, seq_len: int,
               dtype: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [str(MEBP), "train", "--model", f"preset:{preset}", "--data", str(data),
            "--out", str(out), "--steps", str(steps), "--seq-len", str(seq_len),
            "--compute-dtype", dtype, "--metrics", str(metrics), *extra]


def timed_step_s(steps: list[dict]) -> float | None:
    return steady_step_time([s["step_time_s"] for s in steps])


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The preset, sequence length, dtype and bf16 matmul path of the runs a benchmark makes."""
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--bf16-matmul", choices=["auto", "native", "float32"],
                        default="auto")
