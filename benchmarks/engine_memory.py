"""Engine memory and speed: MeBP vs transformers + PEFT, each measurement in a fresh process.

    .venv/bin/python benchmarks/engine_memory.py --presets qwen2.5-0.5b --seq-lens 256 \\
        --configs default low-memory --repeats 3 --steps 3 --cgroup-cap-mb 320 \\
        --json /tmp/engine_memory.json

Per preset, sequence length and engine config (a named set of ``EngineKnobs``, see
``CONFIGS``): the MeBP engine's whole-process peak charged memory (anonymous + shared), the
post-import baseline and the footprint above it (and above a bare ``import torch``), the
median step time after a warm-up step, and the decompression share; a transformers + PEFT
bf16 LoRA baseline in the same run; optionally each config again under a fresh memory cgroup
capped at ``--cgroup-cap-mb`` (runtime included).

With ``--repeats R`` the whole set (every config, then the baseline, per preset and length) is
run R times interleaved, so slow phases of a noisy machine hit every row alike; each row
reports medians over the repeats, and its time ratio is the median of the per-repeat ratios
against the same repeat's baseline. Capped runs happen once per config, after the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._cgroup import BenchCgroup, create_cgroup, evict_page_cache  # noqa: E402
from benchmarks._report import check_targets, markdown_tables  # noqa: E402
from mebp_core.bench.side_by_side import parse_result, preset_hf_dir, worker_argv  # noqa: E402

HF_CACHE = Path("/tmp/mebp-bench-hf")
CGROUP_POLL_S = 0.02
# Named EngineKnobs sets; the measurement child gets them as JSON.
CONFIGS = {
    "default": {"share_decompression": True, "checkpoint_storage": "ram"},
    "low-memory": {"share_decompression": False, "checkpoint_storage": "mmap"},
    # the two halves of low-memory, to attribute its savings
    "tile-ram": {"share_decompression": False, "checkpoint_storage": "ram"},
    "shared-mmap": {"share_decompression": True, "checkpoint_storage": "mmap"},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["qwen2.5-0.5b"])
    p.add_argument("--seq-lens", nargs="+", type=int, default=[256])
    p.add_argument("--configs", nargs="+", default=["default", "low-memory"],
                   choices=list(CONFIGS), help="engine knob sets to measure (see CONFIGS)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every measurement this many times, interleaved; report medians")
    p.add_argument("--steps", type=int, default=3, help="the first is warm-up, not timed")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--quant", default="int4", choices=["int4", "int8", "none"])
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--threads", type=int,
                   help="torch intra-op threads in every child (default: torch's own choice)")
    p.add_argument("--json", type=Path, help="write all results here")
    p.add_argument("--cgroup-cap-mb", type=int, help="also run MeBP under a memory cgroup cap")
    p.add_argument("--cap-configs", nargs="+", choices=list(CONFIGS),
                   help="configs to run under the cap (default: every one in --configs)")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="run the transformers + PEFT bf16 baseline (default: on)")
    p.add_argument("--hf-cache", type=Path, default=HF_CACHE,
                   help="where preset Hugging Face dirs for the baseline are kept")
    return p.parse_args(argv)


# -- children ---------------------------------------------------------------------------------

def run_child(argv: list[str], cgroup: BenchCgroup | None = None) -> dict:
    """Run one measurement child; its result, exit code, wall and CPU time (a child the cap
    killed has no result, only its stderr's tail)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    load = os.getloadavg()[0]
    proc = subprocess.Popen(cgroup.wrap(argv) if cgroup else argv, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    poller = _start_poller(cgroup, stop) if cgroup else None
    stdout, stderr = proc.communicate()
    stop.set()
    if poller:
        poller.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = parse_result(stdout) or {}
    result.update(exit_code=proc.returncode, wall_s=time.perf_counter() - start,
                  cpu_s=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                  loadavg_1m_at_start=load)
    if proc.returncode != 0:
        result["stderr_tail"] = stderr[-2000:]
        result.setdefault("steps_completed", stderr.count("step "))
    return result


def _start_poller(cgroup: BenchCgroup, stop: threading.Event) -> threading.Thread:
    def poll() -> None:
        while not stop.wait(CGROUP_POLL_S):
            cgroup.sample()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


# -- models -----------------------------------------------------------------------------------

def packed_dir(preset: str, quant: str, group_size: int) -> Path:
    from mebp_core.store.resolve import resolve_model

    return resolve_model(f"preset:{preset}", quant=quant, group_size=group_size)


def private_cold_copy(directory: Path, dest: Path) -> Path:
    """A copy of the packed dir whose pages are out of the page cache, so a capped child
    faults (and is charged for) the weights itself instead of reusing cached pages that
    another process (maybe with the same file mapped) has charged elsewhere."""
    shutil.copytree(directory, dest)
    evict_page_cache(dest)
    return dest


# -- measurements -----------------------------------------------------------------------------

def measure_bare_torch() -> dict:
    return run_child(worker_argv("torch", None))


def measure_mebp(model: Path, seq_len: int, config: str, args: argparse.Namespace,
                 cap_mb: int | None = None) -> dict:
    if cap_mb is None:
        return run_child(mebp_argv(model, seq_len, config, args))
    with tempfile.TemporaryDirectory(prefix="mebp-bench-cap-") as tmp:
        cold = private_cold_copy(model, Path(tmp) / model.name)
        group = create_cgroup(cap_mb << 20, f"mebp-bench-{os.getpid()}-{seq_len}-{config}")
        try:
            result = run_child(mebp_argv(cold, seq_len, config, args), group)
            group.sample()
            result["cgroup"] = group.stats()
        finally:
            group.remove()
    return result


def mebp_argv(model: Path, seq_len: int, config: str, args: argparse.Namespace) -> list[str]:
    return worker_argv("mebp", model, "--seq-len", str(seq_len), "--steps", str(args.steps),
                       "--dtype", args.dtype, "--knobs", json.dumps(CONFIGS[config]),
                       *threads_flag(args))


def threads_flag(args: argparse.Namespace) -> list[str]:
    return ["--threads", str(args.threads)] if args.threads else []


def measure_peft(model: Path, seq_len: int, args: argparse.Namespace) -> dict:
    return run_child(worker_argv("peft", model, "--seq-len", str(seq_len),
                                 "--steps", str(args.steps), *threads_flag(args)))


def new_rows(preset: str, args: argparse.Namespace) -> list[dict]:
    return [{"preset": preset, "seq_len": seq_len, "config": config, "knobs": CONFIGS[config],
             "dtype": args.dtype, "quant": args.quant, "group_size": args.group_size,
             "steps": args.steps, "mebp_runs": [], "peft_runs": []}
            for seq_len in args.seq_lens for config in args.configs]


def measure_all(args: argparse.Namespace, bare_torch_mb: float) -> list[dict]:
    """Every (preset, length): each config then the baseline, the whole set ``repeats``
    times over; then the capped runs; then the per-row medians."""
    models = {preset: packed_dir(preset, args.quant, args.group_size) for preset in args.presets}
    hfs = {preset: preset_hf_dir(preset, args.hf_cache) if args.baseline else None
           for preset in args.presets}
    rows = [row for preset in args.presets for row in new_rows(preset, args)]
    for rep in range(args.repeats):
        for preset in args.presets:
            for seq_len in args.seq_lens:
                group = [r for r in rows if r["preset"] == preset and r["seq_len"] == seq_len]
                tag = f"repeat {rep + 1}/{args.repeats} {preset} seq {seq_len}"
                for row in group:
                    log(f"{tag}: mebp {row['config']}")
                    run = measure_mebp(models[preset], seq_len, row["config"], args)
                    run["above_bare_torch_mb"] = run.get("peak_mb", 0) - bare_torch_mb
                    row["mebp_runs"].append(run)
                if hfs[preset] is not None:
                    log(f"{tag}: transformers + PEFT")
                    peft = measure_peft(hfs[preset], seq_len, args)
                    for row in group:  # the same baseline run serves every config's row
                        row["peft_runs"].append(peft)
    if args.cgroup_cap_mb:
        for row in rows:
            if args.cap_configs and row["config"] not in args.cap_configs:
                continue
            log(f"{row['preset']} seq {row['seq_len']}: mebp {row['config']} under a "
                f"{args.cgroup_cap_mb} MB cgroup")
            row["mebp_capped"] = measure_mebp(models[row["preset"]], row["seq_len"],
                                              row["config"], args, args.cgroup_cap_mb)
    for row in rows:
        summarize_row(row)
    return rows


def summarize_row(row: dict) -> None:
    """``mebp`` / ``peft``: per-field medians over the repeats; ``time_ratios``: mebp/HF per
    repeat (same repeat's baseline), ``time_ratio``: their median."""
    row["mebp"] = median_run(row["mebp_runs"])
    if row["peft_runs"]:
        row["peft"] = median_run(row["peft_runs"])
        ratios = [m["s_per_step"] / p["s_per_step"]
                  for m, p in zip(row["mebp_runs"], row["peft_runs"], strict=True)
                  if "s_per_step" in m and "s_per_step" in p]
        row["time_ratios"] = ratios
        row["time_ratio"] = statistics.median(ratios) if ratios else None


def median_run(runs: list[dict]) -> dict:
    """Median of each numeric field over the runs that have it; the worst exit code; the
    fewest steps completed; the s/step range; other fields from the first run."""
    out = dict(runs[0])
    numeric = {k for run in runs for k, v in run.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    for key in numeric:
        values = [run[key] for run in runs if key in run]
        out[key] = statistics.median(values)
    out["exit_code"] = next((r["exit_code"] for r in runs if r["exit_code"] != 0), 0)
    if any("steps_completed" in r for r in runs):
        out["steps_completed"] = min(r.get("steps_completed", 0) for r in runs)
    times = [r["s_per_step"] for r in runs if "s_per_step" in r]
    if times:
        out["s_per_step_range"] = [min(times), max(times)]
    out["repeats"] = len(runs)
    return out


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine_info() -> dict:
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpus": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(),
            "mem_total_mb": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.hf_cache.mkdir(parents=True, exist_ok=True)
    log("bare import torch")
    bare = measure_bare_torch()
    rows = measure_all(args, bare["bare_torch_mb"])
    threads = sorted({run.get("threads") for row in rows
                      for run in row["mebp_runs"] + row["peft_runs"] if run.get("threads")})
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "threads_requested": args.threads, "threads_used": threads,
              "repeats": args.repeats, "configs": {c: CONFIGS[c] for c in args.configs},
              "machine": machine_info(), "bare_torch": bare, "rows": rows,
              "targets": check_targets(rows, args.cgroup_cap_mb)}
    print(markdown_tables(report, args.cgroup_cap_mb))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
