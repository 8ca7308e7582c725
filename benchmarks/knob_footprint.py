"""Footprint, peak and step time of default knobs against default knobs plus some flags,
in alternating fresh ``mebp train`` processes, each in an uncapped memory cgroup.

    .venv/bin/python benchmarks/knob_footprint.py --dtype bfloat16 --bf16-matmul float32 \\
        --with --mlp-chunk-tokens 64

``footprint_mb`` is the engine's own figure: the kernel's count (anonymous + shared) above
what the process held after its imports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._cgroup import create_cgroup  # noqa: E402
from benchmarks._train import add_workload_arguments, timed_step_s, train_argv  # noqa: E402
from mebp_core.bench.corpus import collect_docstrings, write_jsonl  # noqa: E402
from mebp_core.engine.metrics_file import read_steps  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(p)
    p.add_argument("--steps", type=int, default=4, help="the first is not timed")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("--with", dest="flags", nargs=argparse.REMAINDER, default=[],
                   help="the flags of the second variant (the rest of the command line)")
    return p.parse_args(argv)


def run(args: argparse.Namespace, data: Path, work: Path, flags: list[str]) -> dict:
    metrics = work / "metrics.jsonl"
    argv = train_argv(args.preset, data, work / "adapter", metrics, steps=args.steps,
                      seq_len=args.seq_len, dtype=args.dtype,
                      extra=("--bf16-matmul", args.bf16_matmul, *flags))
    group = create_cgroup(1 << 50, f"mebp-knob-footprint-{os.getpid()}-{work.name}")
    try:
        code = subprocess.run(group.wrap(argv), capture_output=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
    finally:
        group.remove()
    steps = read_steps(metrics)
    if code != 0 or len(steps) != args.steps:
        raise SystemExit(f"mebp train exited with {code} after {len(steps)} steps")
    return {"footprint_mb": round(max(s["footprint_mb"] for s in steps), 1),
            "peak_mb": round(max(s["peak_mb"] for s in steps), 1),
            "s_per_step": round(timed_step_s(steps), 3)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mebp-knob-footprint-"))
    variants = {"default": [], " ".join(args.flags) or "default again": list(args.flags)}
    results: dict[str, list[dict]] = {name: [] for name in variants}
    try:
        data = write_jsonl(collect_docstrings(max_files=200), root / "train.jsonl")
        for pair in range(args.pairs):
            for name, flags in variants.items():
                work = root / f"{pair}-{len(results[name])}-{abs(hash(name))}"
                work.mkdir()
                results[name].append(run(args, data, work, flags))
                print(name, results[name][-1], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| knobs | footprint MB | peak MB (kernel) | s/step (median after the first) |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cells = [" / ".join(str(r[key]) for r in runs)
                 for key in ("footprint_mb", "peak_mb", "s_per_step")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
