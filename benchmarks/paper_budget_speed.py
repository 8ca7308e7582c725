"""The memory-for-time tax at the paper's budget, against what a user would run instead:
transformers + PEFT at its fastest dtype on this host (bf16 where the CPU has bf16 matmul
instructions, else float32; everything resident, no checkpointing) beside mebp as the
planner configures it for each budget, each in a fresh process, alternating in one process
tree: every repeat runs the baseline, then every mebp row (their order rotated from repeat
to repeat), and each row's ratio is taken against the same repeat's baseline.

    .venv/bin/python benchmarks/paper_budget_speed.py --pairs 5 --json /tmp/paper_budget.json

Rows: mebp in ``--dtype`` planned for each of ``--budgets`` MB, for its smallest budget S and
unconstrained (the fastest configuration); with ``--also-float32`` mebp's smallest and
fastest in float32 too. Besides each row's ratio to the baseline, the smallest over the
fastest per dtype, pair by pair, and each row's step time as the planner predicts it at
its budget (the re-reads a cap of that size forces included, capped run or not). Plans use
this host's calibration (its identity and steadiness are printed). With ``--capped`` each
row planned for a budget runs inside a fresh memory cgroup hard-capped at that budget, as a
phone with it would, on a private copy of the packed model dropped from the page cache
before each run: the store pages that do not fit beside the step are read again every step
(the planner's disk term); the baseline and the unconstrained rows run uncapped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._cgroup import create_cgroup, evict_page_cache  # noqa: E402
from mebp_core.bench.side_by_side import (  # noqa: E402
    BASELINE,
    BenchError,
    SideBySideSpec,
    log,
    machine_info,
    resolve_models,
    run_worker,
    worker_argv,
)
from mebp_core.cache import default_cache_dir  # noqa: E402
from mebp_core.cpu import cpu_flags, cpu_model, native_bf16_matmul  # noqa: E402
from mebp_core.plan.arch import load_architecture  # noqa: E402
from mebp_core.plan.calibration import load_calibration  # noqa: E402
from mebp_core.plan.on_host import chosen_entry, plan_on_host  # noqa: E402
from mebp_core.units import MB  # noqa: E402

UNCONSTRAINED_MB = 65536
SMALLEST, FASTEST = "smallest", "unconstrained"
FLAGS_SHOWN = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="preset:qwen2.5-0.5b")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--budgets", nargs="+", type=int, default=[320, 512, 1024])
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                   help="mebp's compute dtype for the budget rows")
    p.add_argument("--also-float32", action=argparse.BooleanOptionalAction, default=True,
                   help="also mebp's smallest and fastest configurations in float32")
    p.add_argument("--pairs", type=int, default=5, help="repeats of the whole alternation")
    p.add_argument("--steps", type=int, default=3, help="per process; the first is warm-up")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, help="write every run here")
    p.add_argument("--capped", action="store_true",
                   help="run each row planned for a budget under a hard cap of that budget")
    return p.parse_args(argv)


def baseline_dtype() -> str:
    """What a user would run transformers + PEFT in here: bf16 where native, else float32."""
    return "bfloat16" if native_bf16_matmul() else "float32"


def planned_row(name: str, arch, dtype: str, budget_mb: int | None, seq_len: int,
                threads: int) -> dict:
    """mebp in ``dtype`` as the planner configures it for ``budget_mb`` (None: its smallest)."""
    from mebp_core.config import EngineKnobs, TrainConfig

    config = TrainConfig(seq_len=seq_len, compute_dtype=dtype,
                         knobs=EngineKnobs(threads=threads))
    if budget_mb is None:
        budget_mb = plan_on_host(arch, config).smallest_budget_mb()
    chosen = chosen_entry(plan_on_host(arch, config, budget_bytes=budget_mb * MB))
    knobs = chosen.knobs.model_dump(mode="json", exclude={"threads"})
    return {"row": name, "dtype": dtype, "budget_mb": budget_mb, "config": chosen.id,
            "knobs": knobs, "feasible": chosen.feasible,
            "predicted_peak_mb": round(chosen.prediction.peak_bytes / MB, 1),
            "predicted_step_s": round(chosen.prediction.step_time_s, 3), "runs": []}


def plan_rows(args: argparse.Namespace) -> list[dict]:
    arch = load_architecture(args.model)
    rows = [planned_row(f"{args.dtype} {budget} MB", arch, args.dtype, budget, args.seq_len,
                        args.threads) for budget in args.budgets]
    dtypes = [args.dtype] + (["float32"] if args.also_float32 and args.dtype != "float32"
                             else [])
    for dtype in dtypes:
        rows.append(planned_row(f"{dtype} {SMALLEST}", arch, dtype, None, args.seq_len,
                                args.threads))
        rows.append(planned_row(f"{dtype} {FASTEST}", arch, dtype, UNCONSTRAINED_MB,
                                args.seq_len, args.threads))
    for row in rows:
        row["cap_mb"] = row["budget_mb"] if args.capped and \
            row["budget_mb"] != UNCONSTRAINED_MB else None
    return rows


def run_row(row: dict, argv: list[str], packed: Path) -> dict:
    """One run of ``row``: under its hard cap if it has one, the cgroup's figures beside
    the child's own (a run that fails names its row and the cgroup's). A capped run starts
    with the packed model (this run's private copy) out of the page cache, so it is charged
    for the store pages it keeps, as on a phone; its first, untimed step reads them in."""
    if row["cap_mb"] is None:
        return run_worker(argv)
    evict_page_cache(packed)
    group = create_cgroup(row["cap_mb"] * MB, f"mebp-paper-budget-{os.getpid()}-{time.time_ns()}")
    try:
        try:
            result = run_worker(group.wrap(argv))
        except BenchError as exc:
            raise BenchError(f"mebp {row['row']} under a {row['cap_mb']} MB cap: {exc} "
                             f"(cgroup: {capped_figures(group)})") from exc
        return {**result, "cgroup": capped_figures(group)}
    finally:
        group.remove()


def capped_figures(group) -> dict:
    """The cap's own counters (its peak usage, limit hits and OOM kills); nothing sampled
    it while the child ran."""
    return {k: v for k, v in group.stats().items() if not k.startswith("sampled_")}


def private_packed_copy(packed: Path, stack: ExitStack) -> Path:
    """A copy of the packed model for the capped runs alone: another process on this host
    mapping the shared one would keep its pages cached, charged to its own cgroup."""
    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(
        prefix="mebp-paper-budget-", dir=packed.parent)))
    return Path(shutil.copytree(packed, directory / packed.name))


def run_pairs(args: argparse.Namespace, rows: list[dict], packed: Path, hf: Path,
              capped_packed: Path | None) -> list[dict]:
    """The baseline's runs, one per repeat; each row's runs appended to it (capped rows
    on ``capped_packed``)."""
    common = ["--seq-len", str(args.seq_len), "--steps", str(args.steps),
              "--threads", str(args.threads)]
    baseline_runs = []
    for repeat in range(args.pairs):
        log(f"repeat {repeat + 1}/{args.pairs}: transformers + PEFT {baseline_dtype()}")
        baseline_runs.append(run_worker(worker_argv(BASELINE, hf, *common,
                                                    "--dtype", baseline_dtype())))
        order = rows[repeat % len(rows):] + rows[:repeat % len(rows)]
        for row in order:
            log(f"repeat {repeat + 1}/{args.pairs}: mebp {row['row']} ({row['config']})")
            model = packed if row["cap_mb"] is None else capped_packed
            row["runs"].append(run_row(row, worker_argv(
                "mebp", model, *common, "--dtype", row["dtype"],
                "--knobs", json.dumps(row["knobs"])), model))
    return baseline_runs


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def summarize(rows: list[dict], baseline_runs: list[dict]) -> dict:
    base_s = [run["s_per_step"] for run in baseline_runs]
    for row in rows:
        steps = [run["s_per_step"] for run in row["runs"]]
        row["s_per_step"] = spread(steps)
        row["peak_mb"] = statistics.median(run["peak_mb"] for run in row["runs"])
        row["vs_baseline"] = spread([s / b for s, b in zip(steps, base_s, strict=True)])
    by_name = {row["row"]: row for row in rows}
    smallest_over_fastest = {}
    for name, row in by_name.items():
        if name.endswith(SMALLEST):
            dtype = name.removesuffix(f" {SMALLEST}")
            fastest = by_name[f"{dtype} {FASTEST}"]
            smallest_over_fastest[dtype] = spread([
                a["s_per_step"] / b["s_per_step"]
                for a, b in zip(row["runs"], fastest["runs"], strict=True)])
    return {"baseline": {"dtype": baseline_dtype(), "s_per_step": spread(base_s),
                         "peak_mb": statistics.median(r["peak_mb"] for r in baseline_runs),
                         "runs": baseline_runs},
            "rows": rows, "smallest_over_fastest": smallest_over_fastest}


def fmt_spread(figure: dict, digits: int = 2, suffix: str = "") -> str:
    return (f"{figure['median']:.{digits}f}{suffix} "
            f"({figure['min']:.{digits}f}-{figure['max']:.{digits}f})")


def markdown(report: dict) -> str:
    base = report["baseline"]
    lines = ["| row | configuration | predicted MB | peak MB | cap MB | predicted s/step | "
             "s/step | vs transformers + PEFT |",
             "|---|---|---:|---:|---:|---:|---|---|",
             f"| transformers + PEFT {base['dtype']} | resident, no checkpointing | - | "
             f"{base['peak_mb']:.0f} | - | - | {fmt_spread(base['s_per_step'])} | 1 |"]
    for row in report["rows"]:
        cap = "-" if row["cap_mb"] is None else row["cap_mb"]
        lines.append(f"| mebp {row['row']} | `{row['config']}` | {row['predicted_peak_mb']:.0f}"
                     f" | {row['peak_mb']:.0f} | {cap} | {row['predicted_step_s']:.2f} | "
                     f"{fmt_spread(row['s_per_step'])} | "
                     f"{fmt_spread(row['vs_baseline'], suffix='x')} |")
    lines.append("")
    for dtype, figure in report["smallest_over_fastest"].items():
        lines.append(f"mebp's smallest over its fastest, {dtype}: "
                     f"{fmt_spread(figure, suffix='x')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    calibration = load_calibration(default_cache_dir(), args.threads)
    rows = plan_rows(args)
    packed, hf = resolve_models(SideBySideSpec(model=args.model, seq_len=args.seq_len),
                                needs_hf=True)
    if hf is None:
        print(f"{args.model}: no Hugging Face weights for the baseline", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        capped_packed = None
        if args.capped:
            create_cgroup(MB, f"mebp-paper-budget-probe-{os.getpid()}").remove()  # fail now
            capped_packed = private_packed_copy(packed, stack)
        baseline_runs = run_pairs(args, rows, packed, hf, capped_packed)
    flags = sorted(cpu_flags() & set(FLAGS_SHOWN))
    report = {"machine": {**machine_info(), "cpu": cpu_model(), "flags": flags},
              "calibration": {"identity": calibration.identity,
                              "steady": calibration.steady},
              "model": args.model, "seq_len": args.seq_len, "pairs": args.pairs,
              "steps": args.steps, "threads": args.threads,
              **summarize(rows, baseline_runs)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
