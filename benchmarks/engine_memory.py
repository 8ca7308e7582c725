"""Engine memory and speed: MeBP vs transformers + PEFT, each measurement in a fresh process.

    .venv/bin/python benchmarks/engine_memory.py --presets qwen2.5-0.5b --seq-lens 256 \\
        --steps 3 --cgroup-cap-mb 320 --json /tmp/engine_memory.json

Per preset and sequence length: the MeBP engine's whole-process peak anonymous memory, the
post-import baseline and the footprint above it (and above a bare ``import torch``), the
median step time after a warm-up step, and the decompression share; a transformers + PEFT
bf16 LoRA baseline in the same run; optionally the MeBP child again under a fresh memory
cgroup capped at ``--cgroup-cap-mb`` (runtime included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._cgroup import MemoryCgroup, create_cgroup  # noqa: E402
from benchmarks._report import check_targets, markdown_tables  # noqa: E402
from benchmarks._workers import RESULT_PREFIX  # noqa: E402

HF_CACHE = Path("/tmp/mebp-bench-hf")
CGROUP_POLL_S = 0.02


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["qwen2.5-0.5b"])
    p.add_argument("--seq-lens", nargs="+", type=int, default=[256])
    p.add_argument("--steps", type=int, default=3, help="the first is warm-up, not timed")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--quant", default="int4", choices=["int4", "int8", "none"])
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--threads", type=int,
                   help="torch intra-op threads in every child (default: torch's own choice)")
    p.add_argument("--json", type=Path, help="write all results here")
    p.add_argument("--cgroup-cap-mb", type=int, help="also run MeBP under a memory cgroup cap")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="run the transformers + PEFT bf16 baseline (default: on)")
    p.add_argument("--hf-cache", type=Path, default=HF_CACHE,
                   help="where preset Hugging Face dirs for the baseline are kept")
    return p.parse_args(argv)


# -- children ---------------------------------------------------------------------------------

def worker_argv(kind: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks._workers", kind, *extra]


def run_child(argv: list[str], cgroup: MemoryCgroup | None = None) -> dict:
    """Run one measurement child; its RESULT line, exit code, wall and CPU time."""
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
    result = _parse_result(stdout)
    result.update(exit_code=proc.returncode, wall_s=time.perf_counter() - start,
                  cpu_s=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                  loadavg_1m_at_start=load)
    if proc.returncode != 0:
        result["stderr_tail"] = stderr[-2000:]
        result.setdefault("steps_completed", stderr.count("step "))
    return result


def _start_poller(cgroup: MemoryCgroup, stop: threading.Event) -> threading.Thread:
    def poll() -> None:
        while not stop.wait(CGROUP_POLL_S):
            cgroup.sample()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


def _parse_result(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {}


# -- models -----------------------------------------------------------------------------------

def packed_dir(preset: str, quant: str, group_size: int) -> Path:
    from mebp_core.store.resolve import resolve_model

    return resolve_model(f"preset:{preset}", quant=quant, group_size=group_size)


def hf_dir(preset: str, cache: Path) -> Path:
    """The preset as a Hugging Face dir (its config's dtype), written once and reused."""
    from mebp_core.store.presets import save_preset_as_hf

    out = cache / preset
    if (out / "config.json").is_file():
        return out
    tmp = cache / f".{preset}.tmp{os.getpid()}"
    save_preset_as_hf(preset, tmp)
    tmp.rename(out)
    return out


def private_cold_copy(directory: Path, dest: Path) -> Path:
    """A copy of the packed dir whose pages are out of the page cache, so a capped child
    faults (and is charged for) the weights itself instead of reusing cached pages that
    another process (maybe with the same file mapped) has charged elsewhere."""
    shutil.copytree(directory, dest)
    for path in dest.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return dest


# -- measurements -----------------------------------------------------------------------------

def measure_bare_torch() -> dict:
    return run_child(worker_argv("torch"))


def measure_mebp(model: Path, seq_len: int, args: argparse.Namespace,
                 cap_mb: int | None = None) -> dict:
    if cap_mb is None:
        return run_child(mebp_argv(model, seq_len, args))
    with tempfile.TemporaryDirectory(prefix="mebp-bench-cap-") as tmp:
        cold = private_cold_copy(model, Path(tmp) / model.name)
        group = create_cgroup(cap_mb << 20, f"mebp-bench-{os.getpid()}-{seq_len}")
        try:
            result = run_child(mebp_argv(cold, seq_len, args), group)
            group.sample()
            result["cgroup"] = group.stats()
        finally:
            group.remove()
    return result


def mebp_argv(model: Path, seq_len: int, args: argparse.Namespace) -> list[str]:
    return worker_argv("mebp", "--model", str(model), "--seq-len", str(seq_len),
                       "--steps", str(args.steps), "--dtype", args.dtype, *threads_flag(args))


def threads_flag(args: argparse.Namespace) -> list[str]:
    return ["--threads", str(args.threads)] if args.threads else []


def measure_peft(model: Path, seq_len: int, args: argparse.Namespace) -> dict:
    return run_child(worker_argv("peft", "--model", str(model), "--seq-len", str(seq_len),
                                 "--steps", str(args.steps), *threads_flag(args)))


def measure_preset(preset: str, args: argparse.Namespace, bare_torch_mb: float) -> list[dict]:
    model = packed_dir(preset, args.quant, args.group_size)
    hf = hf_dir(preset, args.hf_cache) if args.baseline else None
    rows = []
    for seq_len in args.seq_lens:
        log(f"{preset} seq {seq_len}: mebp")
        row = {"preset": preset, "seq_len": seq_len, "dtype": args.dtype, "quant": args.quant,
               "group_size": args.group_size, "steps": args.steps,
               "mebp": measure_mebp(model, seq_len, args)}
        row["mebp"]["above_bare_torch_mb"] = row["mebp"].get("peak_anon_mb", 0) - bare_torch_mb
        if hf is not None:
            log(f"{preset} seq {seq_len}: transformers + PEFT")
            row["peft"] = measure_peft(hf, seq_len, args)
        if args.cgroup_cap_mb:
            log(f"{preset} seq {seq_len}: mebp under a {args.cgroup_cap_mb} MB cgroup")
            row["mebp_capped"] = measure_mebp(model, seq_len, args, args.cgroup_cap_mb)
        rows.append(row)
    return rows


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
    rows = []
    for preset in args.presets:
        rows.extend(measure_preset(preset, args, bare["bare_torch_mb"]))
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "threads": args.threads,
              "machine": machine_info(), "bare_torch": bare, "rows": rows,
              "targets": check_targets(rows, args.cgroup_cap_mb)}
    print(markdown_tables(report, args.cgroup_cap_mb))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
