"""Where one configuration's step time goes, against what the planner prices: every matmul
shape the step ran (calls, measured self time) beside its FLOPs at this host's calibrated
rate for that shape (the forward form's, whichever pass ran it), and the torch ops dispatched
beside the planner's count.

    .venv/bin/python benchmarks/step_profile.py --model preset:smollm2-135m \
        --knobs '{"frozen_weights": "lazy", "mlp_chunk_tokens": 64, ...}' --dtype bfloat16

Runs two warm-up steps, then profiles the third with torch.profiler (which slows it a
little: read the ratios, not the seconds).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::addmm_": (1, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:smollm2-135m")
    parser.add_argument("--knobs", default="{}", help="EngineKnobs as JSON")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from mebp_core.bench.worker import random_batch
    from mebp_core.cache import default_cache_dir
    from mebp_core.config import EngineKnobs, TrainConfig
    from mebp_core.engine.checkpoints import make_checkpoints
    from mebp_core.engine.methods import make_step_function
    from mebp_core.engine.model import load_engine_model
    from mebp_core.engine.train import lora_spec_of, make_block_optimizers
    from mebp_core.plan.arch import load_architecture
    from mebp_core.plan.calibration import load_calibration
    from mebp_core.plan.timing import step_work
    from mebp_core.plan.workload import Workload
    from mebp_core.store.resolve import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    knobs = EngineKnobs(**{**json.loads(args.knobs), "threads": args.threads})
    config = TrainConfig(method="mebp", seq_len=args.seq_len, compute_dtype=args.dtype,
                         knobs=knobs)
    engine = load_engine_model(resolve_model(args.model), compute_dtype=args.dtype,
                               lora_spec=lora_spec_of(config), seed=0, knobs=knobs)
    checkpoints = make_checkpoints(knobs.checkpoint_storage, Path(tempfile.mkdtemp()))
    step = make_step_function(engine, config, make_block_optimizers(engine, config),
                              checkpoints)
    batch = random_batch(engine.arch.args.vocab_size, args.seq_len)
    for index in (1, 2):
        step(index, [batch], config.lr)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        step(3, [batch], config.lr)
        wall = time.perf_counter() - start
    checkpoints.close()
    engine.close()

    host = load_calibration(default_cache_dir(), args.threads)
    shapes: dict[tuple, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key not in MATMULS:
            continue
        a, b = (event.input_shapes[i] for i in MATMULS[event.key])
        (rows, inner), (_, width) = a, b
        flops = 2 * rows * inner * width * event.count
        priced = flops / host.matmul_rate(args.dtype, rows, width, "nt")
        entry = shapes[(rows, inner, width)]
        entry[0] += event.count
        entry[1] += event.self_cpu_time_total / 1e6
        entry[2] += priced
    calls = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    # the op count does not depend on which weights are resident (the empty set here)
    work = step_work(Workload(arch=load_architecture(args.model), seq_len=args.seq_len,
                              compute_dtype=args.dtype), knobs, set())
    print(f"profiled step: {wall:.2f} s; aten ops dispatched: {calls} (planner's op count "
          f"{work.ops + work.loss_tile_ops:.0f}: the blocks' {work.ops:.0f}, the loss "
          f"tiles' {work.loss_tile_ops:.0f})\n")
    print("| rows x inner x width | calls | measured s | priced s | ratio | us per call |")
    print("|---|---|---|---|---|---|")
    for (rows, inner, width), (count, measured, priced) in sorted(
            shapes.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"| {rows} x {inner} x {width} | {count} | {measured:.3f} | {priced:.3f} | "
              f"{measured / priced:.1f}x | {measured / count * 1e6:.0f} |")
    measured = sum(e[1] for e in shapes.values())
    priced = sum(e[2] for e in shapes.values())
    count = sum(e[0] for e in shapes.values())
    print(f"\nall matmuls: {count} calls, {measured:.3f} s measured against {priced:.3f} s "
          f"priced at the calibrated rates ({measured / priced:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
