"""bfloat16 against float32 step time, alternating fresh ``mebp train`` processes, so a noisy
machine slows both alike: the ratio per pair, its median and spread, and each run's peak.

    .venv/bin/python benchmarks/bf16_speed.py --preset qwen2.5-0.5b --seq-len 256 --pairs 3

The bf16 runs use ``--bf16-matmul auto`` unless told otherwise (``--bf16-matmul float32``
runs the AVX2 hosts' path on a CPU with native bf16); the report says which path ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._train import timed_step_s, train_argv  # noqa: E402
from mebp_core.bench.corpus import collect_docstrings, write_jsonl  # noqa: E402
from mebp_core.cpu import cpu_flags, cpu_model, matmul_dtype  # noqa: E402
from mebp_core.engine.metrics_file import read_steps  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=4, help="the first is warm-up, not timed")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--bf16-matmul", choices=["auto", "native", "float32"], default="auto")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def run(args: argparse.Namespace, dtype: str, data: Path, work: Path) -> dict:
    metrics = work / f"{dtype}.jsonl"
    subprocess.run(train_argv(args.preset, data, work / dtype, metrics, steps=args.steps,
                              seq_len=args.seq_len, dtype=dtype,
                              extra=("--bf16-matmul", args.bf16_matmul)),
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    steps = read_steps(metrics)
    return {"s_per_step": timed_step_s(steps),
            "peak_mb": max(s["peak_mb"] for s in steps),
            "footprint_mb": max(s["footprint_mb"] for s in steps)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pairs = []
    with tempfile.TemporaryDirectory(prefix="mebp-bf16-speed-") as tmp:
        work = Path(tmp)
        data = write_jsonl(collect_docstrings(max_files=200), work / "train.jsonl")
        for index in range(args.pairs):
            order = ("float32", "bfloat16") if index % 2 == 0 else ("bfloat16", "float32")
            pair = {dtype: run(args, dtype, data, work) for dtype in order}
            pair["ratio"] = pair["bfloat16"]["s_per_step"] / pair["float32"]["s_per_step"]
            print(json.dumps(pair), file=sys.stderr, flush=True)
            pairs.append(pair)
    ratios = [p["ratio"] for p in pairs]
    report = {"cpu": cpu_model(), "cores": os.cpu_count(),
              "bf16_flags": sorted(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"}),
              "bf16_matmul_path": matmul_dtype("bfloat16", args.bf16_matmul), "preset": args.preset,
              "seq_len": args.seq_len, "pairs": pairs, "median_ratio": statistics.median(ratios),
              "min_ratio": min(ratios), "max_ratio": max(ratios)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print("| pair | float32 s/step | bfloat16 s/step | ratio | peak MB fp32 / bf16 |")
    print("|---|---|---|---|---|")
    for index, p in enumerate(pairs, 1):
        print(f"| {index} | {p['float32']['s_per_step']:.2f} | {p['bfloat16']['s_per_step']:.2f} "
              f"| {p['ratio']:.3f} | {p['float32']['peak_mb']:.0f} / "
              f"{p['bfloat16']['peak_mb']:.0f} |")
    print(f"\nmedian ratio {report['median_ratio']:.3f} (range {report['min_ratio']:.3f}-"
          f"{report['max_ratio']:.3f}); bf16 matmuls run in {report['bf16_matmul_path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
