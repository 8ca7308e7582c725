"""``mebp plan``: the arguments, and the table or JSON it prints."""

from __future__ import annotations

import argparse
import json

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.config_args import add_model_arguments, model_values
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.devices import get_device
from mebp_core.plan.methods import METHOD_NAMES, METHODS, MethodPlans, plan_methods_on_host
from mebp_core.plan.planner import DEFAULT_MARGIN, Plan
from mebp_core.plan.workload import PLAN_QUERY_FIELDS
from mebp_core.units import MB

# the knobs a plan takes as given, not as trade-offs: choices of the host the runs use
RUN_KNOBS = ("threads", "bf16_matmul")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="preset:NAME, or a Hugging Face or packed dir with config.json")
    parser.add_argument("--method", choices=[*METHODS, "all"], default="mebp",
                        help="the training method to plan, or all of them side by side "
                             "(default mebp)")
    add_model_arguments(parser, TrainConfig, include=PLAN_QUERY_FIELDS)
    parser.add_argument("--budget-mb", type=positive_float,
                        help="memory budget (default: the device's)")
    parser.add_argument("--device", help="a device profile id (see --list-devices)")
    parser.add_argument("--margin", type=non_negative_float, default=DEFAULT_MARGIN,
                        help="safety margin on predicted peaks (default 0.10)")
    add_model_arguments(parser, EngineKnobs, include=RUN_KNOBS)
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


def build_plan(args: argparse.Namespace) -> MethodPlans:
    config = TrainConfig(**model_values(args, TrainConfig, include=PLAN_QUERY_FIELDS),
                         knobs=EngineKnobs(**model_values(args, EngineKnobs, include=RUN_KNOBS)))
    budget = None if args.budget_mb is None else int(args.budget_mb * MB)
    methods = METHODS if args.method == "all" else (args.method,)
    return plan_methods_on_host(load_architecture(args.model), config, methods,
                                budget_bytes=budget,
                                device=get_device(args.device) if args.device else None,
                                margin=args.margin)


def run_plan(args: argparse.Namespace) -> int:
    plans = build_plan(args)
    if args.method != "all":
        [plan] = plans.plans.values()
        print(json.dumps(plan.to_json(), indent=1) if args.json else
              format_plan(plan, show_all=args.all))
        return 0
    if args.json:
        print(json.dumps(plans.to_json(), indent=1))
        return 0
    sections = [f"== {METHOD_NAMES[method]} ==\n{format_plan(plan, show_all=args.all)}"
                for method, plan in plans.plans.items()]
    sections += [f"== {METHOD_NAMES[method]} ==\nnot planned: {reason}"
                 for method, reason in plans.skipped.items()]
    best = plans.recommendation()
    sections.append("recommended: " + ("nothing fits" if best is None else
                                       f"{METHOD_NAMES[best['method']]} "
                                       f"{best['configuration']}: {best['why']}"))
    print("\n\n".join(sections))
    return 0


def format_plan(plan: Plan, show_all: bool = False) -> str:
    summary = plan.to_json()
    rows = plan.entries if show_all else plan.pareto
    on_device = plan.device is not None and plan.device.rates is not None
    device_column = f" {'phone s':>8}" if on_device else ""
    lines = [f"{'configuration':<48} {'peak MB':>8} {'s/step':>8}{device_column}  fits  "
             "largest part"]
    for entry in sorted(rows, key=lambda e: e.prediction.peak_bytes):
        p = entry.prediction
        fits = {None: "  - ", True: " yes", False: "  no"}[entry.feasible]
        mark = "*" if entry.id == summary["auto"] else " "
        phone = f" {entry.device_step_time_s:>8.2f}" if on_device else ""
        lines.append(f"{mark}{entry.id:<47} {p.peak_bytes / MB:>8.0f} {p.step_time_s:>8.2f}"
                     f"{phone}  {fits}  {p.dominant_component()}")
    budget = summary["budget_mb"]
    lines.append("")
    lines.append(f"budget: {'none' if budget is None else f'{budget:.0f} MB'} "
                 f"(margin {plan.margin:.0%}); smallest budget that fits: "
                 f"{summary['smallest_budget_mb']} MB, dominated by "
                 f"{summary['dominant_component']}")
    lines.append(f"auto (*): {summary['auto'] or 'nothing fits'}")
    if plan.auto is not None and plan.auto.device_step_time_s is not None:
        lines.append(f"{plan.device.name}: about {plan.auto.device_step_time_s:.2f} s/step "
                     "(the device model's estimate)")
    calibration = plan.calibration or {}
    if calibration.get("allocator"):
        lines.append(f"peak MB counts {calibration['allocator']}'s heap, the allocator the "
                     "engines run under here (MEBP_ALLOCATOR)")
    if calibration.get("steady") is False:
        lines.append(f"provisional: this host's calibration is unsteady (its repeats spread "
                     f"{calibration['max_spread']:.1f}x, over the {calibration['spread_bound']:g}x"
                     " bound: a busy host), so s/step here is rough until it is measured again"
                     " on a quieter host; peak MB is unaffected")
    return "\n".join(lines)
