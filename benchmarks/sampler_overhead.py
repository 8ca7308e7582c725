"""What the 2 ms memory sampler costs a training step (issue 13, item 5).

Alternates runs with the sampler thread sampling every 2 ms and runs where it only samples at
step boundaries, each run a fresh process training ``--steps`` steps; reports the time of the
steps after the first (warm-up), per pair and as the median ratio, with the spread.

    .venv/bin/python benchmarks/sampler_overhead.py --model preset:qwen2.5-0.5b --pairs 4
"""

from __future__ import annotations

import argparse
import inspect
import json
import json.decoder
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SAMPLED_INTERVAL_S, UNSAMPLED_INTERVAL_S = 0.002, 3600.0


def write_corpus(path: Path) -> None:
    """Text that ships with Python: the source of two stdlib modules."""
    text = inspect.getsource(json.decoder) + inspect.getsource(inspect)
    rows = [json.dumps({"text": text[i:i + 4000]}) for i in range(0, len(text), 4000)]
    path.write_text("\n".join(rows) + "\n")


def run_child(args: argparse.Namespace) -> None:
    from mebp_core.config import TrainConfig
    from mebp_core.engine.memory import MemorySampler
    from mebp_core.engine.train import train
    from mebp_core.store.resolve import resolve_model

    model_dir = resolve_model(args.model, quant="int4", group_size=64)
    times: list[float] = []
    interval = SAMPLED_INTERVAL_S if args.child == "sampled" else UNSAMPLED_INTERVAL_S
    with MemorySampler(interval_s=interval) as sampler:
        train(TrainConfig(steps=args.steps, seq_len=args.seq_len), model_dir=model_dir,
              data=args.data, out=args.out, sampler=sampler,
              on_step=lambda metrics: times.append(metrics.step_time_s))
    print(json.dumps({"mode": args.child, "timed_s": sum(times[1:])}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:qwen2.5-0.5b")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--child", choices=["sampled", "unsampled"], help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_child(args)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "corpus.jsonl"
        write_corpus(data)
        pairs = []
        for index in range(args.pairs):
            pair = {}
            for mode in ("sampled", "unsampled"):
                done = subprocess.run(
                    [sys.executable, __file__, "--child", mode, "--model", args.model,
                     "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--data",
                     str(data), "--out", str(Path(tmp) / f"out-{mode}-{index}")],
                    capture_output=True, text=True, check=True)
                pair[mode] = json.loads(done.stdout.strip().splitlines()[-1])["timed_s"]
            pairs.append(pair)
            print(f"pair {index + 1}: sampled {pair['sampled']:.2f} s, unsampled "
                  f"{pair['unsampled']:.2f} s", file=sys.stderr, flush=True)
    ratios = [pair["sampled"] / pair["unsampled"] for pair in pairs]
    print("| pair | sampled s | unsampled s | ratio |\n|---:|---:|---:|---:|")
    for index, (pair, ratio) in enumerate(zip(pairs, ratios, strict=True), 1):
        print(f"| {index} | {pair['sampled']:.2f} | {pair['unsampled']:.2f} | {ratio:.3f} |")
    print(f"\nmedian ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-"
          f"{max(ratios):.3f}) over {len(pairs)} pairs, steps 2-{args.steps} of each run")


if __name__ == "__main__":
    main()
