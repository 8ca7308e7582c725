"""What measuring memory costs a training step (issue 13, item 5): the cgroup's own counters,
read at each step's end, and a 2 ms sampling thread, against no measurement at all.

One ``train()`` run in a memory cgroup of its own; every step is measured one of the three
ways, in a shuffled order within each cycle of three steps, so a noisy machine slows all
three alike. A step's time is the whole loop iteration (the measurement's reads included),
from one step's end to the next. Reports the per-cycle ratios against the unmeasured step,
their median and spread.

    .venv/bin/python benchmarks/measurement_overhead.py --preset qwen2.5-0.5b --cycles 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._cgroup import create_cgroup  # noqa: E402
from mebp_core.bench.corpus import collect_docstrings, write_jsonl  # noqa: E402
from mebp_core.cpu import cpu_model  # noqa: E402

MODES = ("none", "counters", "thread")


class AlternatingMeasurement:
    """A memory tracker for ``train()`` that measures each step by the mode the schedule
    names: the cgroup counters, the sampling thread, or nothing."""

    def __init__(self, schedule: list[str]) -> None:
        from mebp_core.engine.memory import MemorySampler, track_memory

        self.counters = track_memory("cgroup")
        self.thread = MemorySampler(interval_s=0.002)
        self.schedule, self.position = schedule, 0
        self.method = "alternating"
        for name in ("baseline_bytes", "baseline_anon_bytes", "usage_peak_bytes"):
            setattr(self, name, getattr(self.counters, name))

    def __getattr__(self, name: str):  # the run's peaks: the counters' (they see every step)
        return getattr(self.counters, name)

    @property
    def mode(self) -> str:
        return self.schedule[min(self.position, len(self.schedule) - 1)]

    def __enter__(self):
        self.counters.start()
        self._begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.stop()
        self.counters.stop()

    def _begin(self) -> None:
        if self.mode == "thread":
            self.thread.start()

    def take_step_peak(self) -> int:
        mode = self.mode
        peak = 0
        if mode == "counters":
            peak = self.counters.take_step_peak()
        elif mode == "thread":
            self.thread.stop()
            peak = self.thread.take_step_peak()
        self.position += 1
        self._begin()
        return peak


def run_child(args: argparse.Namespace) -> None:
    from mebp_core.config import TrainConfig
    from mebp_core.engine.train import train
    from mebp_core.store.resolve import resolve_model

    model_dir = resolve_model(f"preset:{args.preset}", quant="int4", group_size=64)
    rng = random.Random(0)
    schedule = ["none"]  # the warm-up step, not timed
    for _ in range(args.cycles):
        schedule += rng.sample(MODES, len(MODES))
    ends: list[float] = []
    measurement = AlternatingMeasurement(schedule)
    with measurement:
        ends.append(time.perf_counter())
        train(TrainConfig(steps=len(schedule), seq_len=args.seq_len,
                          compute_dtype=args.dtype),
              model_dir=model_dir, data=args.data, out=args.out, memory=measurement,
              on_step=lambda _: ends.append(time.perf_counter()))
    # the first interval holds loading and the warm-up step
    steps = [{"mode": mode, "s": ends[i + 1] - ends[i]} for i, mode in enumerate(schedule)]
    print(json.dumps({"steps": steps[1:]}))


def ratios(steps: list[dict]) -> dict[str, list[float]]:
    """Per cycle of three steps: each measured step's time over the unmeasured one's."""
    out: dict[str, list[float]] = {"counters": [], "thread": []}
    for start in range(0, len(steps) - len(MODES) + 1, len(MODES)):
        cycle = {step["mode"]: step["s"] for step in steps[start:start + len(MODES)]}
        for mode in out:
            out[mode].append(cycle[mode] / cycle["none"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_child(args)
    from mebp_core.store.resolve import resolve_model

    resolve_model(f"preset:{args.preset}", quant="int4", group_size=64)  # packed outside
    with tempfile.TemporaryDirectory(prefix="mebp-measurement-") as tmp:
        data = write_jsonl(collect_docstrings(max_files=200), Path(tmp) / "train.jsonl")
        group = create_cgroup(16 << 30, f"mebp-measurement-{os.getpid()}")  # no cap: its own
        try:
            argv = [sys.executable, __file__, "--child", "--preset", args.preset,
                    "--seq-len", str(args.seq_len), "--dtype", args.dtype,
                    "--cycles", str(args.cycles), "--data", str(data),
                    "--out", str(Path(tmp) / "adapter")]
            done = subprocess.run(group.wrap(argv), capture_output=True, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
        finally:
            group.remove()
    if done.returncode != 0:
        sys.exit(f"the training child failed:\n{done.stderr[-3000:]}")
    steps = json.loads(done.stdout.strip().splitlines()[-1])["steps"]
    by_mode = {mode: [s["s"] for s in steps if s["mode"] == mode] for mode in MODES}
    print(f"{args.preset} seq {args.seq_len} {args.dtype}, {args.cycles} cycles, "
          f"{cpu_model()}, {os.cpu_count()} cores\n")
    print("| measurement | median step s | median ratio to none | range of ratios |")
    print("|---|---:|---:|---:|")
    per_cycle = ratios(steps)
    for mode in MODES:
        r = per_cycle.get(mode)
        spread = f"{statistics.median(r):.3f} | {min(r):.3f}-{max(r):.3f}" if r else "1 | –"
        print(f"| {mode} | {statistics.median(by_mode[mode]):.3f} | {spread} |")


if __name__ == "__main__":
    main()
