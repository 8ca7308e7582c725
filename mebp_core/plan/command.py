"""``mebp plan``: the arguments, and the table or JSON it prints."""

from __future__ import annotations

import argparse
import json

from mebp_core.cache import default_cache_dir
from mebp_core.config import TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import load_calibration
from mebp_core.plan.devices import get_device
from mebp_core.plan.planner import DEFAULT_MARGIN, Plan, make_plan
from mebp_core.plan.workload import Workload
from mebp_core.units import MB


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="preset:NAME, or a Hugging Face or packed dir with config.json")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--lora-alpha", type=float, default=16.0)
    parser.add_argument("--lora-targets", default="all")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    parser.add_argument("--compute-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--quant", choices=["none", "int8", "int4"], default="int4")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--budget-mb", type=positive_float,
                        help="memory budget (default: the device's)")
    parser.add_argument("--device", help="a device profile id (see --list-devices)")
    parser.add_argument("--margin", type=non_negative_float, default=DEFAULT_MARGIN,
                        help="safety margin on predicted peaks (default 0.10)")
    parser.add_argument("--threads", type=int, help="torch threads the runs will use")
    parser.add_argument("--bf16-matmul", choices=["auto", "native", "float32"], default="auto",
                        help="the bf16 matmul path the runs will take (auto: this CPU's)")
    parser.add_argument("--all", action="store_true",
                        help="list every configuration, not only the Pareto front")
    parser.add_argument("--json", action="store_true", help="print the whole plan as JSON")


def positive_float(text: str) -> float:
    return _bounded_float(text, allow_zero=False)


def non_negative_float(text: str) -> float:
    return _bounded_float(text, allow_zero=True)


def _bounded_float(text: str, *, allow_zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value >= 0 if allow_zero else value > 0) or value == float("inf"):
        kind = "non-negative" if allow_zero else "positive"
        raise argparse.ArgumentTypeError(f"must be a {kind} number, got {text!r}")
    return value


def build_plan(args: argparse.Namespace) -> Plan:
    config = TrainConfig(seq_len=args.seq_len, batch_size=args.batch_size,
                         lora_rank=args.lora_rank, lora_alpha=args.lora_alpha,
                         lora_targets=args.lora_targets, optimizer=args.optimizer,
                         compute_dtype=args.compute_dtype, quant=args.quant,
                         group_size=args.group_size)
    workload = Workload.from_config(load_architecture(args.model), config)
    device = get_device(args.device) if args.device else None
    budget = None if args.budget_mb is None else int(args.budget_mb * MB)
    host = load_calibration(default_cache_dir(), args.threads)
    return make_plan(workload, host, budget_bytes=budget, device=device, margin=args.margin,
                     bf16_matmul=args.bf16_matmul)


def run_plan(args: argparse.Namespace) -> int:
    plan = build_plan(args)
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print(format_plan(plan, show_all=args.all))
    return 0


def format_plan(plan: Plan, show_all: bool = False) -> str:
    summary = plan.to_json()
    rows = plan.entries if show_all else plan.pareto
    lines = [f"{'configuration':<48} {'peak MB':>8} {'s/step':>8}  fits  largest part"]
    for entry in sorted(rows, key=lambda e: e.prediction.peak_bytes):
        p = entry.prediction
        fits = {None: "  - ", True: " yes", False: "  no"}[entry.feasible]
        mark = "*" if entry.id == summary["auto"] else " "
        lines.append(f"{mark}{entry.id:<47} {p.peak_bytes / MB:>8.0f} {p.step_time_s:>8.2f}  "
                     f"{fits}  {p.dominant_component()}")
    budget = summary["budget_mb"]
    lines.append("")
    lines.append(f"budget: {'none' if budget is None else f'{budget:.0f} MB'} "
                 f"(margin {plan.margin:.0%}); smallest budget that fits: "
                 f"{summary['smallest_budget_mb']} MB, dominated by "
                 f"{summary['dominant_component']}")
    lines.append(f"auto (*): {summary['auto'] or 'nothing fits'}")
    if plan.auto is not None and plan.auto.device_step_time_s is not None:
        lines.append(f"{plan.device.name}: about {plan.auto.device_step_time_s:.2f} s/step "
                     "(an estimate from its compute figure)")
    return "\n".join(lines)
