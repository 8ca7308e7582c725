"""Measurement children for ``engine_memory.py``: each runs in a fresh process and prints one
``RESULT {json}`` line. Heavy imports happen inside the functions, so every child pays only
for its own runtime.

    python -m benchmarks._workers torch
    python -m benchmarks._workers mebp --model PACKED_DIR --seq-len 256 --steps 3 \\
        [--no-share-decompression] [--checkpoint-storage mmap]
    python -m benchmarks._workers peft --model HF_DIR --seq-len 256 --steps 3
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable

from mebp_core.units import MB

RESULT_PREFIX = "RESULT "
VOCAB_CAP = 32000  # token ids are drawn from [0, 32000), valid for every preset
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def emit(result: dict) -> None:
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def charged_mb() -> float:
    """The process's memory as the kernel charges it: anonymous + shared."""
    from mebp_core.kernel_memory import read_memory

    return read_memory().charged_bytes / MB


def peak_rss_mb() -> float:
    """VmHWM: peak resident memory, file-backed pages (mmap'd weights, libraries) included."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def set_threads(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)


def random_batch(seq_len: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB_CAP, (1, seq_len), generator=g)
    return ids, ids.clone()


def timed_steps(step: Callable[[int], dict], steps: int, memory) -> list[dict]:
    """Run ``step(i)`` ``steps`` times; each record gets its time and its own peak."""
    records = []
    for i in range(steps):
        start = time.perf_counter()
        record = step(i)
        record["step_time_s"] = time.perf_counter() - start
        record["step_peak_mb"] = memory.take_step_peak() / MB
        records.append(record)
        print(f"step {i + 1}/{steps}: {record['step_time_s']:.2f} s", file=sys.stderr, flush=True)
    return records


def summarize(records: list[dict], memory, baseline_mb: float) -> dict:
    timed = records[1:] or records  # the first step is warm-up
    return {
        "steps_completed": len(records),
        "step_times_s": [r["step_time_s"] for r in records],
        "s_per_step": statistics.median(r["step_time_s"] for r in timed),
        "losses": [r["loss"] for r in records],
        "peak_mb": memory.peak_bytes / MB,  # the kernel's figure: anonymous + shared
        "peak_anon_mb": memory.peak_anon_bytes / MB,
        "post_import_mb": baseline_mb,
        "footprint_mb": memory.footprint_bytes / MB,
        "step_peak_mb": [r["step_peak_mb"] for r in records],
        "peak_rss_mb": peak_rss_mb(),
    }


def run_torch(_: argparse.Namespace) -> dict:
    import torch

    gc.collect()
    return {"bare_torch_mb": charged_mb(), "torch_version": torch.__version__,
            "threads": torch.get_num_threads()}


def run_mebp(args: argparse.Namespace) -> dict:
    import torch

    from mebp_core.config import EngineKnobs, TrainConfig
    from mebp_core.engine.checkpoints import make_checkpoints
    from mebp_core.engine.mebp import count_valid_targets, run_mebp_step
    from mebp_core.engine.memory import track_memory
    from mebp_core.engine.train import load_engine_model, lora_spec_of, make_block_optimizers

    set_threads(args.threads)
    gc.collect()
    memory = track_memory()  # baseline: runtime + engine imported, nothing loaded
    memory.start()
    knobs = EngineKnobs(share_decompression=args.share_decompression,
                        checkpoint_storage=args.checkpoint_storage)
    cfg = TrainConfig(seq_len=args.seq_len, compute_dtype=args.dtype, knobs=knobs)
    engine = load_engine_model(args.model, compute_dtype=cfg.compute_dtype,
                               lora_spec=lora_spec_of(cfg), seed=0, knobs=cfg.knobs)
    opts = make_block_optimizers(engine, cfg)
    ckpts = make_checkpoints(cfg.knobs.checkpoint_storage)
    ids, labels = random_batch(args.seq_len)
    elem = torch.empty((), dtype=engine.dtype).element_size()
    ckpt_bytes = len(engine.layers) * ids.numel() * engine.arch.args.hidden_size * elem
    scale = 1.0 / count_valid_targets(labels)

    def step(_: int) -> dict:
        engine.working_set.reset_counters()
        res = run_mebp_step(engine, ids, labels, ckpts, loss_scale=scale,
                            on_block_done=lambda i: opts[i].step())
        return {"loss": res.loss_sum / max(res.valid_tokens, 1),
                "decompress_s": engine.working_set.decompress_s,
                "weights_live_peak_mb": engine.working_set.peak_bytes / MB}

    records = timed_steps(step, args.steps, memory)
    ckpts.close()
    engine.close()
    memory.stop()
    out = summarize(records, memory, memory.baseline_bytes / MB)
    out.update(decompress_summary(records))
    out.update(threads=torch.get_num_threads(), knobs=cfg.knobs.model_dump(),
               # L x (B, T, D): in RssAnon with "ram", file-backed (not in RssAnon) with "mmap"
               checkpoint_mb=ckpt_bytes / MB)
    return out


def decompress_summary(records: list[dict]) -> dict:
    timed = records[1:] or records
    return {
        "decompress_s": [r["decompress_s"] for r in records],
        "decompress_s_median": statistics.median(r["decompress_s"] for r in timed),
        "decompress_share": statistics.median(r["decompress_s"] / r["step_time_s"]
                                              for r in timed),
        "weights_live_peak_mb": max(r["weights_live_peak_mb"] for r in records),
    }


def run_peft(args: argparse.Namespace) -> dict:
    import peft
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from mebp_core.engine.memory import track_memory

    set_threads(args.threads)
    gc.collect()
    memory = track_memory()  # baseline: torch + transformers + peft imported
    memory.start()
    model = build_peft_model(AutoModelForCausalLM, args.model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-4)
    ids, labels = random_batch(args.seq_len)

    def step(_: int) -> dict:
        out = model(input_ids=ids, labels=labels, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"loss": float(out.loss)}

    records = timed_steps(step, args.steps, memory)
    memory.stop()
    out = summarize(records, memory, memory.baseline_bytes / MB)
    out.update(threads=torch.get_num_threads(), transformers_version=transformers.__version__,
               peft_version=peft.__version__, trainable_params=sum(p.numel() for p in params))
    return out


def build_peft_model(auto_cls, hf_dir: str):
    import torch
    from peft import LoraConfig, get_peft_model

    model = auto_cls.from_pretrained(hf_dir, dtype=torch.bfloat16)
    model.config.use_cache = False
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, lora_dropout=0.0,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    return model


RUNNERS = {"torch": run_torch, "mebp": run_mebp, "peft": run_peft}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=sorted(RUNNERS))
    p.add_argument("--model", help="packed dir (mebp) or Hugging Face dir (peft)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    p.add_argument("--share-decompression", action=argparse.BooleanOptionalAction,
                   default=True, help="mebp: EngineKnobs.share_decompression")
    p.add_argument("--checkpoint-storage", default="ram", choices=["ram", "mmap"],
                   help="mebp: EngineKnobs.checkpoint_storage")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    emit(RUNNERS[args.kind](args))


if __name__ == "__main__":
    main()
