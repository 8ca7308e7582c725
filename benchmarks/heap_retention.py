"""The heap retentions the planner counts, checked per allocator: for each knob setting (graph
tails of K blocks, the no-checkpoint step, checkpoints every block) run ``mebp train`` uncapped
in a fresh memory cgroup under each allocator (``MEBP_ALLOCATOR``), take the kernel's count
(the larger of the cgroup's sampled anonymous + shared memory and the engine's own per-step
peak) and set it beside the planner's prediction for the same knobs with that allocator's
retentions (``mebp_core/plan/heap_retention.py``).

    .venv/bin/python benchmarks/heap_retention.py --preset qwen2.5-0.5b --dtype bfloat16 \\
        --settings tail1 tail4 tail16 nockpt ckpt1 --json /tmp/heap.json

A setting is ``tailK``, ``nockpt``, ``ckpt1`` (checkpoints every block, whole MLP: the
default knobs) or ``smallest`` (the plan's pick at its smallest budget, as
``benchmarks/plan_caps.py`` runs it under its cap).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._cgroup import run_in_cgroup  # noqa: E402
from benchmarks._machine import machine_report  # noqa: E402
from benchmarks._train import add_workload_arguments, train_argv  # noqa: E402
from mebp_core.bench.corpus import collect_docstrings, write_jsonl  # noqa: E402
from mebp_core.cache import default_cache_dir  # noqa: E402
from mebp_core.config import EngineKnobs, TrainConfig  # noqa: E402
from mebp_core.engine.metrics_file import read_steps  # noqa: E402
from mebp_core.plan.arch import load_architecture  # noqa: E402
from mebp_core.plan.calibration import load_calibration  # noqa: E402
from mebp_core.plan.on_host import chosen_entry, plan_on_host  # noqa: E402
from mebp_core.plan.predict import predict  # noqa: E402
from mebp_core.plan.workload import Workload, matmul_dtype_of  # noqa: E402
from mebp_core.store.resolve import resolve_model  # noqa: E402
from mebp_core.units import MB  # noqa: E402

ALLOCATORS = ("jemalloc", "glibc")


def setting_knobs(args: argparse.Namespace, setting: str) -> EngineKnobs:
    """The knobs a setting names, at ``args``' matmul path."""
    base = EngineKnobs(bf16_matmul=args.bf16_matmul)
    if setting == "nockpt":
        return base.model_copy(update={"checkpoint_blocks": "none"})
    if setting == "ckpt1":
        return base
    if setting.startswith("tail") and setting[4:].isdigit():
        return base.model_copy(update={"graph_tail_blocks": int(setting[4:])})
    if setting == "smallest":  # the plan's pick at its own smallest budget S
        arch, config = load_architecture(f"preset:{args.preset}"), train_config(args, base)
        smallest_mb = plan_on_host(arch, config).smallest_budget_mb()
        return chosen_entry(plan_on_host(arch, config, budget_bytes=smallest_mb * MB)).knobs
    raise SystemExit(f"--settings: {setting!r} is not tailK, nockpt, ckpt1 or smallest")


def knob_flags(knobs: EngineKnobs) -> list[str]:
    """`mebp train`'s flags for the knobs that differ from the defaults."""
    flags = []
    for field, value in knobs.model_dump().items():
        if value == EngineKnobs.model_fields[field].default:
            continue
        flag = f"--{field.replace('_', '-')}"
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        else:
            flags += [flag, str(value)]
    return flags


def train_config(args: argparse.Namespace, knobs: EngineKnobs) -> TrainConfig:
    return TrainConfig(seq_len=args.seq_len, compute_dtype=args.dtype, knobs=knobs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(p)
    p.add_argument("--settings", nargs="+", default=["tail1", "tail4", "tail16", "nockpt",
                                                     "ckpt1"])
    p.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=list(ALLOCATORS))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", type=Path, help="write every row here")
    return p.parse_args(argv)


def predicted_mb(args: argparse.Namespace, knobs: EngineKnobs, allocator: str
                 ) -> tuple[float, str]:
    """The planner's peak for these knobs under ``allocator``'s retentions, and the matmul
    dtype they run in."""
    config = train_config(args, knobs)
    workload = Workload.from_config(load_architecture(f"preset:{args.preset}"), config)
    host = load_calibration(default_cache_dir(), config.knobs.threads)
    prediction = predict(workload, knobs, dataclasses.replace(host, allocator=allocator))
    return round(prediction.peak_bytes / MB, 1), matmul_dtype_of(workload, knobs)


def measure(args: argparse.Namespace, data: Path, work: Path, knobs: EngineKnobs,
            allocator: str) -> dict:
    metrics = work / "metrics.jsonl"
    argv = train_argv(args.preset, data, work / "adapter", metrics, steps=args.steps,
                      seq_len=args.seq_len, dtype=args.dtype, extra=tuple(knob_flags(knobs)))
    code, stderr, cgroup = run_in_cgroup(
        argv, 1 << 50, f"mebp-heap-retention-{os.getpid()}-{time.time_ns()}",
        {**os.environ, "HF_HUB_OFFLINE": "1", "MEBP_ALLOCATOR": allocator})
    steps = read_steps(metrics)
    if code != 0 or len(steps) != args.steps:
        raise SystemExit(f"mebp train {' '.join(knob_flags(knobs))} under {allocator} exited "
                         f"with {code} after {len(steps)} steps: {stderr.strip()[-400:]}")
    step_peaks = [round(s["peak_mb"], 1) for s in steps]
    return {"step_peaks_mb": step_peaks,
            "kernel_peak_mb": round(max(max(step_peaks), cgroup["sampled_peak_charged_mb"]), 1)}


def markdown(rows: list[dict]) -> str:
    lines = ["| setting | allocator | kernel MB (steps) | predicted MB | error |",
             "|---|---|---|---|---|"]
    for r in rows:
        steps = ", ".join(str(p) for p in r["step_peaks_mb"])
        lines.append(f"| {r['setting']} | {r['allocator']} | {r['kernel_peak_mb']} ({steps}) "
                     f"| {r['predicted_mb']} | {r['prediction_error']:+.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # measured and packed outside the cgroups, once (either would count in the first row)
    load_calibration(default_cache_dir())
    resolve_model(f"preset:{args.preset}")
    root = Path(tempfile.mkdtemp(prefix="mebp-heap-retention-"))
    rows = []
    try:
        data = write_jsonl(collect_docstrings(max_files=200), root / "train.jsonl")
        for setting in args.settings:
            knobs = setting_knobs(args, setting)
            for allocator in args.allocators:  # alternating, setting by setting
                predicted, matmul = predicted_mb(args, knobs, allocator)
                work = Path(tempfile.mkdtemp(dir=root))
                row = {"setting": setting, "knobs": " ".join(knob_flags(knobs)),
                       "allocator": allocator, "matmul_dtype": matmul,
                       "predicted_mb": predicted, **measure(args, data, work, knobs, allocator)}
                row["prediction_error"] = round(predicted / row["kernel_peak_mb"] - 1, 3)
                shutil.rmtree(work, ignore_errors=True)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {"machine": machine_report(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "preset": args.preset,
              "seq_len": args.seq_len, "dtype": args.dtype, "steps": args.steps, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
