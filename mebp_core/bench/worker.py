"""One measurement in a fresh process; prints exactly one JSON line (the result) on stdout.
The one measurement child of ``mebp bench`` and the scripts in ``benchmarks/``.

    python -m mebp_core.bench.worker {mebp,mezo,backprop} --model PACKED_DIR --seq-len 256 \\
        --steps 3 [--threads N] [--dtype bfloat16] [--knobs JSON]
    python -m mebp_core.bench.worker peft --model HF_DIR --seq-len 256 --steps 3
    python -m mebp_core.bench.worker cosine --model PACKED_DIR --seq-len 256 --seeds 5
    python -m mebp_core.bench.worker torch   # a bare ``import torch``: the runtime's memory

Heavy imports happen inside the runners, and the memory baseline is taken after them, so
``footprint_mb`` is what the method added above its imported runtime. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Callable

from mebp_core.allocator import reexec_under_engine_allocator
from mebp_core.plan.correction import steady_step_time
from mebp_core.units import MB

ENGINE_METHODS = ("mebp", "mezo", "backprop")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR = 1e-4  # the value does not matter for timing; finite updates keep the work realistic


def random_batch(vocab_size: int, seq_len: int, seed: int = 0):
    """input_ids and labels (1, T): uniform random tokens, every position scored."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (1, seq_len), generator=generator)
    return input_ids, input_ids.clone()


def run_timed_steps(step: Callable[[], dict], steps: int, memory) -> list[dict]:
    """``step()`` returns its record (the loss at least); each record gets its wall time and
    its own peak."""
    records = []
    for index in range(steps):
        start = time.perf_counter()
        record = step()
        elapsed = time.perf_counter() - start
        records.append({**record, "step_time_s": elapsed,
                        "step_peak_mb": memory.take_step_peak() / MB})
        print(f"step {index + 1}/{steps}: {elapsed:.2f} s loss {record['loss']:.4f}",
              file=sys.stderr, flush=True)
    return records


def summarize_steps(records: list[dict], memory) -> dict:
    """The median step time excludes the first (warm-up) step when there are others."""
    times = [r["step_time_s"] for r in records]
    return {"steps_completed": len(records), "step_times_s": times,
            "s_per_step": steady_step_time(times),
            "losses": [r["loss"] for r in records],
            # the kernel's figure (anonymous + shared); anonymous alone beside it
            "peak_mb": memory.peak_bytes / MB,
            "post_import_mb": memory.baseline_bytes / MB,
            "footprint_mb": memory.footprint_bytes / MB,
            "peak_anon_mb": memory.peak_anon_bytes / MB,
            "post_import_anon_mb": memory.baseline_anon_bytes / MB,
            "step_peak_mb": [r["step_peak_mb"] for r in records],
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """VmHWM: peak resident memory, file-backed pages (mapped weights, libraries) included."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def decompression_summary(records: list[dict]) -> dict:
    """Time spent decompressing frozen weights per step, and its share after warm-up."""
    timed = records[1:] or records
    return {"decompress_s": [r["decompress_s"] for r in records],
            "decompress_s_median": statistics.median(r["decompress_s"] for r in timed),
            "decompress_share": statistics.median(r["decompress_s"] / r["step_time_s"]
                                                  for r in timed),
            # what the step dequantized, to hold beside the planner's count
            "decompressed_params": statistics.median(r["decompressed_params"] for r in timed),
            "weights_live_peak_mb": max(r["weights_live_peak_mb"] for r in records),
            **{f"{key}_median": statistics.median(r[key] for r in timed)
               for key in DIRECT_READ_FIGURES if key in records[0]}}


DIRECT_READ_FIGURES = ("read_wait_s", "read_mb", "in_line_reads")


def direct_reads_before(store):
    """A copy of a directly read store's counters (None for a mapped store)."""
    stats = getattr(store, "read_stats", None)
    return None if stats is None else dataclasses.replace(stats)


def direct_reads_since(store, before) -> dict:
    """What a directly read store read and waited for since ``before``: nothing for a
    mapped one."""
    if before is None:
        return {}
    now = store.read_stats
    return {"read_wait_s": now.wait_s - before.wait_s,
            "read_mb": (now.bytes_read - before.bytes_read) / MB,
            "in_line_reads": now.in_line_reads - before.in_line_reads}


def engine_config(args: argparse.Namespace, method: str):
    from mebp_core.config import EngineKnobs, TrainConfig

    knobs = json.loads(args.knobs) if args.knobs else {}
    return TrainConfig(method=method, steps=args.steps, seq_len=args.seq_len, lr=LR,
                       compute_dtype=args.dtype, seed=args.seed,
                       knobs=EngineKnobs(**{**knobs, "threads": args.threads}))


def run_engine(args: argparse.Namespace) -> dict:
    """mebp, mezo or backprop through the training loop's own step functions."""
    import torch

    from mebp_core.engine.checkpoints import make_checkpoints
    from mebp_core.engine.memory import track_memory
    from mebp_core.engine.methods import make_step_function
    from mebp_core.engine.model import load_engine_model
    from mebp_core.engine.train import lora_spec_of, make_block_optimizers

    config = engine_config(args, args.kind)
    if args.threads:
        torch.set_num_threads(args.threads)
    gc.collect()
    with track_memory() as memory:  # baseline: torch and the engine imported, nothing loaded
        engine = load_engine_model(args.model, compute_dtype=config.compute_dtype,
                                   lora_spec=lora_spec_of(config), seed=config.seed,
                                   knobs=config.knobs)
        checkpoints = make_checkpoints(config.knobs.checkpoint_storage, args.scratch_dir)
        try:
            step_function = make_step_function(engine, config,
                                               make_block_optimizers(engine, config),
                                               checkpoints)
            batch = random_batch(engine.arch.args.vocab_size, args.seq_len, args.seed)
            counter = iter(range(1, args.steps + 1))

            def step() -> dict:
                engine.working_set.reset_counters()
                reads = direct_reads_before(engine.store)
                result = step_function(next(counter), [batch], config.lr)
                return {"loss": result.loss_sum / max(result.valid_tokens, 1),
                        "decompress_s": engine.working_set.decompress_s,
                        "decompressed_params": engine.working_set.decompressed_params,
                        "weights_live_peak_mb": engine.working_set.peak_bytes / MB,
                        **direct_reads_since(engine.store, reads)}

            records = run_timed_steps(step, args.steps, memory)
            element = torch.empty((), dtype=engine.dtype).element_size()
            # L x (B, T, D) block inputs, when every block is checkpointed
            checkpoint_mb = (len(engine.layers) * args.seq_len * engine.arch.args.hidden_size
                             * element / MB)
        finally:
            checkpoints.close()
            engine.close()
    return {**summarize_steps(records, memory), **decompression_summary(records),
            "threads": torch.get_num_threads(), "knobs": config.knobs.model_dump(mode="json"),
            "checkpoint_mb": checkpoint_mb}


def run_peft(args: argparse.Namespace) -> dict:
    """transformers + PEFT (bf16 unless ``--dtype``): what a user would pick on a CPU box."""
    import peft
    import torch
    import transformers

    from mebp_core.engine.memory import track_memory

    if args.threads:
        torch.set_num_threads(args.threads)
    gc.collect()
    with track_memory() as memory:  # baseline: torch, transformers and peft imported
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model,
                                                                  dtype=getattr(torch, args.dtype))
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS,
                               lora_dropout=0.0, task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, lora)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=LR)
        input_ids, labels = random_batch(model.config.vocab_size, args.seq_len, args.seed)

        def step() -> dict:
            out = model(input_ids=input_ids, labels=labels, use_cache=False)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return {"loss": float(out.loss)}

        records = run_timed_steps(step, args.steps, memory)
    return {**summarize_steps(records, memory), "threads": torch.get_num_threads(),
            "transformers_version": transformers.__version__, "peft_version": peft.__version__,
            "trainable_params": sum(p.numel() for p in params)}


def run_torch(_: argparse.Namespace) -> dict:
    """What a bare ``import torch`` costs: the baseline every footprint is quoted above."""
    import torch

    from mebp_core.kernel_memory import read_memory

    gc.collect()
    return {"bare_torch_mb": read_memory().charged_bytes / MB,
            "torch_version": torch.__version__, "threads": torch.get_num_threads()}


def run_cosine(args: argparse.Namespace) -> dict:
    """Cosine of MeZO's one-sample estimate and the exact LoRA gradient, one per seed."""
    import torch

    from mebp_core.engine.mezo import cosine_similarity_to_true_gradient, named_lora_parameters
    from mebp_core.engine.model import load_engine_model
    from mebp_core.engine.train import lora_spec_of

    config = engine_config(args, "mebp")
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = load_engine_model(args.model, compute_dtype=config.compute_dtype,
                               lora_spec=lora_spec_of(config), seed=config.seed)
    try:
        input_ids, labels = random_batch(engine.arch.args.vocab_size, args.seq_len, args.seed)
        cosines = []
        for seed in range(args.seeds):
            cosines.append(cosine_similarity_to_true_gradient(
                engine, input_ids, labels, step_seed=seed, eps=args.eps))
            print(f"seed {seed}: cosine {cosines[-1]:.6f}", file=sys.stderr, flush=True)
        dimension = sum(p.numel() for _, p in named_lora_parameters(engine))
    finally:
        engine.close()
    return {"cosines": cosines, "cosine_mean": statistics.fmean(cosines),
            "cosine_std": statistics.pstdev(cosines), "lora_parameters": dimension,
            # E|<g, z>| / (|g| |z|) for z ~ N(0, I) in d dimensions: the exact-FD expectation
            "cosine_expected": math.sqrt(2 / (math.pi * dimension)), "eps": args.eps,
            "dtype": args.dtype}


ENGINE_KINDS = ("mebp", "mezo", "backprop", "cosine")
RUNNERS = {"mebp": run_engine, "mezo": run_engine, "backprop": run_engine, "peft": run_peft,
           "cosine": run_cosine, "torch": run_torch}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=list(RUNNERS))
    parser.add_argument("--model", help="a packed dir (engine methods, cosine) or a Hugging "
                        "Face dir (peft); torch takes none")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="the first one is warm-up")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scratch-dir", default=".", help="where memory-mapped checkpoints "
                        "go: a directory on disk (a tmpfs would make them shared memory)")
    parser.add_argument("--knobs", help="engine methods: trade-off knobs as a JSON object")
    parser.add_argument("--seeds", type=int, default=5, help="cosine: MeZO directions")
    parser.add_argument("--eps", type=float, default=1e-3, help="cosine: MeZO's eps")
    args = parser.parse_args(argv)
    if args.kind != "torch" and args.model is None:
        parser.error(f"{args.kind} needs --model")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if argv is None and args.kind in ENGINE_KINDS:
        reexec_under_engine_allocator()  # the baselines run as their users run them
    result = {"kind": args.kind, "seq_len": args.seq_len, **RUNNERS[args.kind](args)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
