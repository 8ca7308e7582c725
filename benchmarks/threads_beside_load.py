"""What a job's thread count costs beside load: one engine step on every core against one
thread, on an idle host and with every core but one kept busy (what the worker meets when
other jobs run, and why it takes one thread per free core; ``worker/host_plan.py``).

Each repeat runs the four cases in a shuffled order (one measurement child each, the bench
child of ``mebp bench``), so a noisy machine slows them alike; times are quoted as ratios
to the same repeat's "every core, idle" run.

    .venv/bin/python benchmarks/threads_beside_load.py --preset smollm2-135m --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mebp_core.bench.side_by_side import run_worker, worker_argv  # noqa: E402
from mebp_core.cpu import cpu_flags, cpu_model  # noqa: E402
from mebp_core.store.resolve import resolve_model  # noqa: E402

CORES = os.cpu_count() or 1
CASES = [(threads, busy) for busy in (False, True) for threads in (CORES, 1)]
BASELINE = (CORES, False)


def run_case(packed: Path, args: argparse.Namespace, threads: int, busy: bool) -> float:
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(CORES - 1 if busy else 0)]
    try:
        result = run_worker(worker_argv("mebp", packed, "--seq-len", str(args.seq_len),
                                        "--steps", str(args.steps), "--dtype", args.dtype,
                                        "--threads", str(threads)))
    finally:
        for process in spinning:
            process.kill()
            process.wait()
    return result["s_per_step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    packed = resolve_model(f"preset:{args.preset}", quant="int4", group_size=64)
    rng = random.Random(0)
    rounds = []
    for repeat in range(args.repeats):
        times = {}
        for case in rng.sample(CASES, len(CASES)):
            times[case] = run_case(packed, args, *case)
            print(f"repeat {repeat + 1}: {case[0]} threads, {'busy' if case[1] else 'idle'}: "
                  f"{times[case]:.3f} s/step", file=sys.stderr, flush=True)
        rounds.append(times)
    print(f"{args.preset} seq {args.seq_len} {args.dtype}, {CORES} cores, {cpu_model()} "
          f"({' '.join(sorted(cpu_flags() & {'avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'}))})")
    print("| threads | other cores | s/step (median) | x every core idle (median, range) |")
    print("|---|---|---|---|")
    rows = []
    for case in CASES:
        ratios = [r[case] / r[BASELINE] for r in rounds]
        seconds = statistics.median(r[case] for r in rounds)
        rows.append({"threads": case[0], "busy": case[1], "s_per_step": seconds,
                     "ratios": ratios})
        print(f"| {case[0]} | {'all but one busy' if case[1] else 'idle'} | {seconds:.2f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
