"""The planner's promise, checked by the kernel: for each preset, sequence length and dtype,
take the plan's own smallest budget S and run ``mebp train --plan-budget-mb S`` for a few
steps inside a fresh memory cgroup hard-capped at S MB (no swap). A row holds when the run
completes and the chosen configuration's predicted peak is within ``--tolerance`` of the
kernel's count (the larger of the cgroup's sampled anon + shmem and the process's own).

    .venv/bin/python benchmarks/plan_caps.py --json /tmp/plan_caps.json

The calibration and the packed presets are made first, outside any cap.
"""

from __future__ import annotations

import argparse
import itertools
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
from benchmarks._train import timed_step_s, train_argv  # noqa: E402
from mebp_core.bench.corpus import collect_docstrings, write_jsonl  # noqa: E402
from mebp_core.cache import default_cache_dir  # noqa: E402
from mebp_core.config import EngineKnobs, TrainConfig  # noqa: E402
from mebp_core.engine.metrics_file import read_steps  # noqa: E402
from mebp_core.plan.arch import load_architecture  # noqa: E402
from mebp_core.plan.calibration import load_calibration  # noqa: E402
from mebp_core.plan.on_host import chosen_entry, plan_on_host  # noqa: E402
from mebp_core.plan.workload import matmul_dtype_of  # noqa: E402
from mebp_core.units import MB  # noqa: E402

CASES = (("smollm2-135m", 256), ("qwen2.5-0.5b", 256), ("gemma3-1b", 256),
         ("qwen2.5-1.5b", 256), ("qwen2.5-0.5b", 1024))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", metavar="PRESET:SEQ",
                   default=[f"{name}:{seq}" for name, seq in CASES])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "bfloat16"])
    p.add_argument("--methods", nargs="+", default=["mebp"],
                   choices=["mebp", "mezo", "backprop"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="predicted peak within this fraction of the kernel's count")
    p.add_argument("--bf16-matmul", choices=["auto", "native", "float32"], default="auto",
                   help="the bfloat16 rows' matmul path (float32: the AVX2 hosts' path)")
    p.add_argument("--json", type=Path, help="write every row here")
    p.add_argument("--budget-mb", type=int,
                   help="a fixed budget (and cap) instead of each plan's smallest: the "
                        "planner picks the fastest configuration predicted to fit it")
    p.add_argument("--uncapped", action="store_true",
                   help="run in an unlimited cgroup: the peak the configuration reaches freely")
    return p.parse_args(argv)


def plan_case(preset: str, seq_len: int, dtype: str, bf16_matmul: str = "auto",
              budget_mb: int | None = None, method: str = "mebp") -> dict:
    arch = load_architecture(f"preset:{preset}")
    config = TrainConfig(method=method, seq_len=seq_len, compute_dtype=dtype,
                         knobs=EngineKnobs(bf16_matmul=bf16_matmul))
    if budget_mb is None:
        budget_mb = plan_on_host(arch, config).smallest_budget_mb()
    plan = plan_on_host(arch, config, budget_bytes=budget_mb * MB)
    chosen = chosen_entry(plan)
    return {"preset": preset, "seq_len": seq_len, "method": method, "dtype": dtype,
            "bf16_matmul": bf16_matmul,
            "matmul_dtype": matmul_dtype_of(plan.workload, chosen.knobs),
            "budget_mb": budget_mb, "config": chosen.id,
            "predicted_peak_mb": round(chosen.prediction.peak_bytes / MB, 1),
            "predicted_step_s": round(chosen.prediction.step_time_s, 2)}


def run_capped(row: dict, data: Path, steps: int, work: Path, capped: bool = True) -> dict:
    metrics, out = work / "metrics.jsonl", work / "adapter"
    argv = train_argv(row["preset"], data, out, metrics, steps=steps, seq_len=row["seq_len"],
                      dtype=row["dtype"], extra=("--method", row["method"],
                                                 "--plan-budget-mb", str(row["budget_mb"]),
                                                 "--bf16-matmul", row["bf16_matmul"]))
    cap = row["budget_mb"] * MB if capped else 1 << 50
    code, stderr, cgroup = run_in_cgroup(argv, cap,
                                         f"mebp-plan-caps-{os.getpid()}-{time.time_ns()}",
                                         {**os.environ, "HF_HUB_OFFLINE": "1"})
    steps_done = read_steps(metrics)
    process_peak = max((s["peak_mb"] for s in steps_done), default=0.0)
    kernel = max(process_peak, cgroup["sampled_peak_charged_mb"])
    step_s = timed_step_s(steps_done)
    completed = code == 0 and len(steps_done) == steps
    return {"exit_code": code, "steps_completed": len(steps_done),
            "completed": completed, "process_peak_mb": round(process_peak, 1),
            "cgroup_charged_peak_mb": round(cgroup["sampled_peak_charged_mb"], 1),
            "cgroup_file_peak_mb": round(cgroup["sampled_peak_file_mb"], 1),
            "cgroup_max_usage_mb": cgroup.get("max_usage_mb"),
            "oom_kill": cgroup.get("oom_kill"), "kernel_peak_mb": round(kernel, 1),
            "prediction_error": round(row["predicted_peak_mb"] / kernel - 1, 3) if kernel else None,
            "measured_step_s": None if step_s is None else round(step_s, 2),
            "stderr_tail": None if completed else stderr.strip()[-400:]}


def prepare(cases: list[tuple[str, int]]) -> None:
    """Calibrate and pack outside any cap (each would otherwise run inside the first one)."""
    from mebp_core.store.resolve import resolve_model

    load_calibration(default_cache_dir())
    for preset in dict.fromkeys(name for name, _ in cases):
        print(f"packing {preset}", file=sys.stderr, flush=True)
        resolve_model(f"preset:{preset}")


def holds(row: dict, tolerance: float) -> bool:
    """Completed under its cap, with the predicted peak within ``tolerance`` of the count."""
    error = row["prediction_error"]
    return row["completed"] and error is not None and abs(error) <= tolerance


def markdown(rows: list[dict], tolerance: float) -> str:
    lines = ["| preset | seq | method | dtype (matmul) | budget S MB | chosen configuration "
             "| predicted MB | kernel MB (cgroup / process) | error | 3 steps under S | s/step "
             "(predicted / measured) |", "|" + "---|" * 11]
    for r in rows:
        error = r["prediction_error"]
        held = "yes" if r["completed"] else f"no (exit {r['exit_code']}, {r['oom_kill']} OOM)"
        lines.append(
            f"| {r['preset']} | {r['seq_len']} | {r.get('method', 'mebp')} "
            f"| {r['dtype']} ({r['matmul_dtype']}) "
            f"| {r['budget_mb']} | `{r['config']}` | {r['predicted_peak_mb']} "
            f"| {r['kernel_peak_mb']} ({r['cgroup_charged_peak_mb']} / {r['process_peak_mb']}) "
            f"| {'-' if error is None else f'{error:+.1%}'} | {held} "
            f"| {r['predicted_step_s']} / {r['measured_step_s']} |")
    held = sum(holds(r, tolerance) for r in rows)
    lines.append(f"\n{held} of {len(rows)} rows hold (completed, error within "
                 f"{tolerance:.0%}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [(spec.split(":")[0], int(spec.split(":")[1])) for spec in args.cases]
    prepare(cases)
    corpus = Path(tempfile.mkdtemp(prefix="mebp-plan-caps-"))
    data = write_jsonl(collect_docstrings(max_files=200), corpus / "train.jsonl")
    rows = []
    try:
        for (preset, seq_len), method, dtype in itertools.product(cases, args.methods,
                                                                  args.dtypes):
            row = plan_case(preset, seq_len, dtype, args.bf16_matmul, args.budget_mb,
                            method)
            print(f"{preset} seq {seq_len} {method} {dtype}: S = {row['budget_mb']} MB, "
                  f"{row['config']}", file=sys.stderr, flush=True)
            work = Path(tempfile.mkdtemp(dir=corpus))
            row.update(run_capped(row, data, args.steps, work, not args.uncapped))
            shutil.rmtree(work, ignore_errors=True)
            print(f"  -> {json.dumps(row)}", file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        shutil.rmtree(corpus, ignore_errors=True)
    report = {"machine": machine_report(),
              "date": time.strftime("%Y-%m-%d"), "steps": args.steps,
              "tolerance": args.tolerance, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(markdown(rows, args.tolerance))
    return 0 if all(holds(r, args.tolerance) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
