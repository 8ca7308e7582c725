"""Pretrain the pycode-12m preset from scratch on the Python standard library.

    nice -n 19 .venv/bin/python -m benchmarks.pretrain_pycode --work-dir /tmp/pycode-pretrain \
        --time-budget-minutes 58

A llama model of the preset's config (mebp_core/store/preset_configs.py) is trained with
transformers' LlamaForCausalLM, float32, a fixed seed: AdamW, linear warm-up then cosine
decay (over `--steps`, or over the wall-time budget when that runs out first), batches of
random `seq_len` windows of the training stream, the held-out loss every `eval_every` steps.
A checkpoint is saved every `checkpoint_every` steps; rerunning the same command resumes
from it (`--export-checkpoint` writes the model as it is there). At the end the float model
is written as a Hugging Face directory (`<work-dir>/hf`), with the corpus description and a
JSON log of the run beside it. Packing it into the shipped store is `mebp pack` (see
BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from benchmarks.pycode_corpus import describe_corpus, encode_stream, list_corpus_files, split_corpus
from mebp_core.store.hf_checkpoint import write_hf_checkpoint
from mebp_core.store.preset_configs import PRESET_CONFIGS
from mebp_core.store.shapes import expected_shapes

PRESET = "pycode-12m"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=25)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--time-budget-minutes", type=float, default=None,
                   help="end after this much wall time, the cosine following wall time")
    p.add_argument("--export-checkpoint", action="store_true",
                   help="write <work-dir>/hf from the last checkpoint and stop (no training)")
    return p.parse_args()


def run_progress(step: int, elapsed_s: float, args: argparse.Namespace) -> float:
    """The fraction of the run done: by steps, or by wall time when that is further along
    (on a machine shared with other work, a step count cannot be sized in advance)."""
    by_steps = step / args.steps
    if args.time_budget_minutes is None:
        return by_steps
    return max(by_steps, elapsed_s / (args.time_budget_minutes * 60))


def learning_rate(step: int, progress: float, args: argparse.Namespace) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)


def build_model(seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**PRESET_CONFIGS[PRESET])
    return LlamaForCausalLM(config).float()


def sample_batch(stream: torch.Tensor, args: argparse.Namespace, g: torch.Generator):
    starts = torch.randint(0, len(stream) - args.seq_len, (args.batch_size,), generator=g)
    return torch.stack([stream[s : s + args.seq_len] for s in starts.tolist()]).long()  # (B, T)


def held_out_windows(stream: torch.Tensor, args: argparse.Namespace) -> torch.Tensor:
    """`eval_windows` consecutive-chunk windows spread evenly over the held-out stream."""
    chunks = len(stream) // args.seq_len
    picks = torch.linspace(0, chunks - 1, min(args.eval_windows, chunks)).long()
    return torch.stack([stream[i * args.seq_len : (i + 1) * args.seq_len] for i in picks]).long()


@torch.no_grad()
def evaluate(model: torch.nn.Module, windows: torch.Tensor) -> float:
    model.eval()
    total = 0.0
    for rows in windows.split(16):
        total += model(input_ids=rows, labels=rows).loss.item() * rows.numel()
    model.train()
    return total / windows.numel()


def save_atomically(obj: object, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_outputs(model: torch.nn.Module, corpus: dict, log: dict, work_dir: Path) -> None:
    out = work_dir / "hf"
    out.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    shapes = expected_shapes(PRESET_CONFIGS[PRESET])
    tensors = ((name, state[name].detach().clone()) for name in shapes)
    write_hf_checkpoint(out, PRESET_CONFIGS[PRESET], tensors)
    (work_dir / "corpus.json").write_text(json.dumps(corpus, indent=2) + "\n")
    (work_dir / "log.json").write_text(json.dumps(log, indent=2) + "\n")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = PRESET_CONFIGS[PRESET]["vocab_size"]
    training_files, held_out_files = split_corpus(list_corpus_files())
    corpus = describe_corpus(training_files, held_out_files)
    train_stream = encode_stream(training_files, vocab_size)
    windows = held_out_windows(encode_stream(held_out_files, vocab_size), args)
    print(f"corpus: {corpus['training']} held out: {corpus['held_out']['file_count']} files, "
          f"{len(windows)} windows", flush=True)

    model = build_model(args.seed)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(args.seed)
    log = {"args": {k: str(v) for k, v in vars(args).items()}, "parameters": params,
           "machine": platform.processor() or platform.machine(), "train": [], "held_out": [],
           "wall_seconds": 0.0}
    step = 0
    checkpoint_path = args.work_dir / "checkpoint.pt"
    if checkpoint_path.exists():
        ckpt = torch.load(checkpoint_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        g.set_state(ckpt["generator"])
        step, log = ckpt["step"], ckpt["log"]
        print(f"resumed at step {step}", flush=True)
    else:
        log["held_out"].append({"step": 0, "loss": evaluate(model, windows)})
        print(f"step 0 held-out {log['held_out'][-1]['loss']:.4f} ({params} parameters)",
              flush=True)

    if args.export_checkpoint:
        write_outputs(model, corpus, log, args.work_dir)
        print(f"exported step {step}: {args.work_dir / 'hf'}", flush=True)
        return
    model.train()
    last_tick = time.monotonic()
    while run_progress(step, log["wall_seconds"], args) < 1:
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, run_progress(step, log["wall_seconds"], args), args)
        batch = sample_batch(train_stream, args, g)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        optimizer.step()
        step += 1
        seconds = time.perf_counter() - started
        log["train"].append({"step": step, "loss": round(loss.item(), 5),
                             "grad_norm": round(grad_norm, 4), "seconds": round(seconds, 3)})
        print(f"step {step} loss {loss.item():.4f} lr {optimizer.param_groups[0]['lr']:.2e} "
              f"gnorm {grad_norm:.2f} {seconds:.2f}s", flush=True)
        now = time.monotonic()
        log["wall_seconds"] += now - last_tick  # evaluation and checkpoints included
        last_tick = now
        last = run_progress(step, log["wall_seconds"], args) >= 1
        if step % args.eval_every == 0 or last:
            log["held_out"].append({"step": step, "loss": evaluate(model, windows)})
            print(f"step {step} held-out {log['held_out'][-1]['loss']:.4f}", flush=True)
        if step % args.checkpoint_every == 0 or last:
            log["tokens_seen"] = step * args.batch_size * args.seq_len
            save_atomically({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "generator": g.get_state(), "step": step, "log": log},
                            checkpoint_path)
    log["tokens_seen"] = step * args.batch_size * args.seq_len
    write_outputs(model, corpus, log, args.work_dir)
    print(f"done: {args.work_dir / 'hf'}", flush=True)


if __name__ == "__main__":
    main()
