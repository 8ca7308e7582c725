"""``mebp bench``: the arguments and the runner the CLI wires in."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mebp_core.bench.convergence import ConvergenceSpec
from mebp_core.bench.side_by_side import BASELINE, METHODS, SideBySideSpec

DEFAULT_WORK_DIR = Path("bench-out/convergence")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``mebp bench`` (side by side by default, ``--convergence`` for curves)."""
    parser.add_argument("--model", help="preset:NAME, a Hugging Face dir or a packed dir "
                        "(default: preset:qwen2.5-0.5b; preset:tiny with --convergence)")
    parser.add_argument("--seq-len", type=int, help="default 256 (128 with --convergence)")
    parser.add_argument("--compute-dtype", choices=["float32", "bfloat16"],
                        help="engine compute dtype (default bfloat16; float32 with "
                        "--convergence)")
    parser.add_argument("--quant", choices=["none", "int8", "int4"], default="int4")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--threads", type=int, help="torch intra-op threads in every run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the full report here")
    side = parser.add_argument_group("side by side")
    side.add_argument("--steps", type=int, default=3, help="steps per method; the first is "
                      "warm-up and not timed")
    side.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    side.add_argument("--repeats", type=int, default=1,
                      help="run every method this many times, interleaved; report medians")
    side.add_argument("--cosine-seeds", type=int, default=5, help="MeZO directions for the "
                      "cosine to the exact gradient (0: skip)")
    check = parser.add_argument_group("plan check")
    check.add_argument("--plan-check", action="store_true",
                       help="measure the planner's Pareto configurations against predictions")
    check.add_argument("--method", choices=[m for m in METHODS if m != BASELINE],
                       default="mebp", help="the method whose front is checked (default mebp)")
    check.add_argument("--models", nargs="+", default=["preset:qwen2.5-0.5b"],
                       help="models to check (default preset:qwen2.5-0.5b)")
    check.add_argument("--seq-lens", nargs="+", type=int, default=[128, 256])
    check.add_argument("--max-configs", type=int,
                       help="at most this many front configurations per model and length")
    check.add_argument("--learn", action="store_true",
                       help="feed each measured run into a fresh copy of this host's time "
                       "correction before predicting the next, as the service's worker does "
                       "(the first run is uncorrected; the cached correction is untouched)")
    check.add_argument("--with-peft", action="store_true",
                       help="also time transformers + PEFT once per model and length")
    conv = parser.add_argument_group("convergence")
    conv.add_argument("--convergence", action="store_true",
                      help="mebp vs mezo validation-loss curves on the stdlib docstrings")
    defaults = ConvergenceSpec()
    for name in ("mezo_steps", "mezo_eval_every", "mebp_steps", "mebp_eval_every",
                 "validation_chars"):
        conv.add_argument("--" + name.replace("_", "-"), type=int,
                          default=getattr(defaults, name))
    for name in ("mezo_lr", "mezo_eps", "mebp_lr"):
        conv.add_argument("--" + name.replace("_", "-"), type=float,
                          default=getattr(defaults, name))
    conv.add_argument("--mebp-optimizer", choices=["sgd", "adamw"],
                      default=defaults.mebp_optimizer)
    conv.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                      help="corpus, metrics and adapters go here")
    conv.add_argument("--png", type=Path, help="the plot (default WORK_DIR/convergence.png)")


def side_by_side_spec(args: argparse.Namespace) -> SideBySideSpec:
    return SideBySideSpec(
        model=args.model or "preset:qwen2.5-0.5b", seq_len=args.seq_len or 256,
        steps=args.steps, methods=tuple(args.methods), threads=args.threads,
        compute_dtype=args.compute_dtype or "bfloat16", quant=args.quant,
        group_size=args.group_size, repeats=args.repeats, cosine_seeds=args.cosine_seeds,
        seed=args.seed)


def convergence_spec(args: argparse.Namespace) -> ConvergenceSpec:
    return ConvergenceSpec(
        model=args.model or "preset:tiny", seq_len=args.seq_len or 128,
        mezo_steps=args.mezo_steps, mezo_lr=args.mezo_lr, mezo_eps=args.mezo_eps,
        mezo_eval_every=args.mezo_eval_every, mebp_steps=args.mebp_steps,
        mebp_optimizer=args.mebp_optimizer, mebp_lr=args.mebp_lr,
        mebp_eval_every=args.mebp_eval_every, validation_chars=args.validation_chars,
        compute_dtype=args.compute_dtype or "float32", quant=args.quant,
        group_size=args.group_size, threads=args.threads, seed=args.seed)


def run_bench(args: argparse.Namespace) -> int:
    """Run the chosen mode, print its summary, write ``--json``; 0 on success."""
    if args.plan_check:
        from mebp_core.bench.plan_check import PlanCheckSpec, format_plan_check, run_plan_check

        report = run_plan_check(PlanCheckSpec(
            models=tuple(args.models), seq_lens=tuple(args.seq_lens), method=args.method,
            steps=args.steps,
            compute_dtype=args.compute_dtype or "float32", quant=args.quant,
            group_size=args.group_size, threads=args.threads, max_configs=args.max_configs,
            with_peft=args.with_peft, seed=args.seed, learn=args.learn))
        text = format_plan_check(report)
    elif args.convergence:
        from mebp_core.bench.convergence import format_summary, run_convergence

        report = run_convergence(convergence_spec(args), args.work_dir, args.png)
        text = format_summary(report)
    else:
        from mebp_core.bench.side_by_side import format_table, run_side_by_side

        report = run_side_by_side(side_by_side_spec(args))
        text = format_table(report)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0
