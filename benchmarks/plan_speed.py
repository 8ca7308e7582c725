"""How long planning takes: one plan (the first in a process, the same one again, and made
afresh in a warm process), and creating a 256-phone simulated fleet through the real API.

    .venv/bin/python benchmarks/plan_speed.py --repeats 5 --json /tmp/plan_speed.json

Plans: each repeat is a fresh Python process (its imports done before the clock starts) that
calls ``plan_on_host`` as the CLI and the API do, with this host's calibration at the
service's thread count (one per core): first, then the same plan again (memoized), then the
same plan after ``forget_plans`` (made again in a warm process). Fleets: ``mebp serve
--workers 0`` (embedded SQLite and Redis, a fresh data dir) and --fleets ``POST /v1/fleets``
of ``simulated: {device: pixel-8, count: 256}`` phones of preset:tiny, timed at the client;
the first one in the service plans, the later ones find the plan made. ``--code DIR`` runs
another checkout's code (the planner before this benchmark, say) under the same clock.
Prints a markdown table with the median and range of each, the 1-minute load average
before and after, and whether the targets hold (one plan <= 100 ms; a 256-phone fleet < 2 s).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.service_load import free_port, wait_until_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PLAN_TARGET_MS = 100.0
FLEET_TARGET_S = 2.0
PHONES = 256
CASES = {  # name -> plan_on_host's arguments beside the model and seq_len
    "qwen2.5-0.5b seq 256, pixel-8": ("preset:qwen2.5-0.5b", 256, {"device": "pixel-8"}),
    "smollm2-135m seq 256, 300 MB": ("preset:smollm2-135m", 256, {"budget_mb": 300}),
}
# what each repeat's fresh process runs: argv[1] the case as JSON, argv[2] the cache dir
PLAN_CHILD = """
import json, sys, time
import mebp_core
assert mebp_core.__file__.startswith(sys.argv[3]), mebp_core.__file__  # the code asked for
from pathlib import Path
from mebp_core.config import TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.devices import get_device
from mebp_core.plan.on_host import plan_on_host
try:
    from mebp_core.plan.on_host import forget_plans
except ImportError:  # a planner without a memo
    forget_plans = None
model, seq_len, where, threads = json.loads(sys.argv[1])
arch = load_architecture(model)
config = TrainConfig(seq_len=seq_len)
config = config.model_copy(update={"knobs": config.knobs.model_copy(
    update={"threads": threads})})
args = {"device": get_device(where["device"])} if "device" in where else \\
    {"budget_bytes": where["budget_mb"] << 20}

def timed():
    wall, cpu = time.perf_counter(), time.process_time()
    plan = plan_on_host(arch, config, cache_dir=Path(sys.argv[2]), measure=False, **args)
    return (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3, plan

first_ms, first_cpu_ms, plan = timed()
again_ms, _, _ = timed()
if forget_plans is not None:
    forget_plans()
afresh_ms, afresh_cpu_ms, _ = timed()
print(json.dumps({"first_ms": first_ms, "first_cpu_ms": first_cpu_ms, "again_ms": again_ms,
                  "afresh_ms": afresh_ms, "afresh_cpu_ms": afresh_cpu_ms,
                  "configurations": len(plan.entries),
                  "auto": None if plan.auto is None else plan.auto.id}))
"""


def load_average() -> float:
    return os.getloadavg()[0]


def code_env(code: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1", **(extra or {})}


def time_plans(code: Path, cache: Path, threads: int, repeats: int) -> dict:
    rows = {}
    for name, (model, seq_len, where) in CASES.items():
        runs = []
        for _ in range(repeats):
            done = subprocess.run(
                [sys.executable, "-c", PLAN_CHILD, json.dumps([model, seq_len, where, threads]),
                 str(cache), str(code.resolve())], capture_output=True, text=True,
                env=code_env(code), cwd=code,
                check=False, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"planning {name} failed:\n{done.stderr}")
            runs.append(json.loads(done.stdout))
        rows[name] = {"runs": runs, **{key: summary([r[key] for r in runs]) for key in (
            "first_ms", "first_cpu_ms", "again_ms", "afresh_ms", "afresh_cpu_ms")},
            "configurations": runs[0]["configurations"], "auto": runs[0]["auto"]}
    return rows


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def time_fleets(code: Path, cache: Path, fleets: int, root: Path) -> dict:
    """``fleets`` 256-phone fleets created one after another in a fresh ``mebp serve``."""
    key = secrets.token_hex(16)
    port = free_port()
    env = code_env(code, {"MEBP_API_KEY": key, "MEBP_CACHE_DIR": str(cache),
                          # every fleet queues a job per phone; no worker runs them
                          "MEBP_MAX_QUEUED_JOBS_PER_TENANT": str(PHONES * (fleets + 1))})
    env.pop("REDIS_URL", None)
    env.pop("DATABASE_URL", None)
    log = root / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers", "0",
             "--data-dir", str(root / "data")], stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=code)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log, timeout_s=900)  # may measure the host first
        client = httpx.Client(base_url=url, timeout=120,
                              headers={"Authorization": f"Bearer {key}"})
        rows = b"".join(json.dumps({"text": f"phone row {i}: the quick brown fox"}).encode() +
                        b"\n" for i in range(4 * PHONES))
        dataset = client.post("/v1/datasets", files={"file": ("phones.jsonl", rows)})
        dataset.raise_for_status()
        body = {"model": "preset:tiny", "training_file": dataset.json()["id"],
                "simulated": {"device": "pixel-8", "count": PHONES},
                "hyperparameters": {"steps": 2, "seq_len": 32}}
        seconds = []
        for _ in range(fleets):
            start = time.perf_counter()
            response = client.post("/v1/fleets", json=body)
            seconds.append(time.perf_counter() - start)
            if response.status_code != 201:
                raise SystemExit(f"POST /v1/fleets: {response.status_code} {response.text}")
            assert len(response.json()["members"]) == PHONES
        client.close()
    finally:
        process.terminate()
        process.wait(timeout=60)
    return {"seconds": seconds, "first_s": seconds[0],
            "later_s": summary(seconds[1:]) if len(seconds) > 1 else None}


def ensure_calibration(code: Path, cache: Path, threads: int) -> None:
    """This host's calibration at ``threads``, measured now (minutes) if the cache has none,
    so no timed plan measures."""
    subprocess.run([sys.executable, "-c",
                    "import sys; from pathlib import Path; "
                    "from mebp_core.plan.calibration import load_calibration; "
                    "load_calibration(Path(sys.argv[1]), int(sys.argv[2]))",
                    str(cache), str(threads)], env=code_env(code), cwd=code, check=True,
                   timeout=3600)


def table(report: dict) -> list[str]:
    def ms(s: dict) -> str:
        return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"
    lines = ["| plan | configurations | first ms | first CPU ms | made again ms | "
             "memoized ms |", "|---|---:|---:|---:|---:|---:|"]
    for name, row in report["plans"].items():
        lines.append(f"| {name} | {row['configurations']} | {ms(row['first_ms'])} | "
                     f"{ms(row['first_cpu_ms'])} | {ms(row['afresh_ms'])} | "
                     f"{ms(row['again_ms'])} |")
    fleets = report["fleets"]
    if fleets:
        later = fleets["later_s"]
        lines += ["", f"| {PHONES}-phone simulated fleet | first in the service s | "
                  "later ones s |", "|---|---:|---:|",
                  f"| POST /v1/fleets (preset:tiny, pixel-8) | {fleets['first_s']:.2f} | " +
                  ("-" if later is None else
                   f"{later['median']:.2f} ({later['min']:.2f}-{later['max']:.2f})") + " |"]
    return lines


def targets(report: dict) -> dict[str, bool]:
    held = {f"plan {name} <= {PLAN_TARGET_MS:.0f} ms": row["first_ms"]["median"] <=
            PLAN_TARGET_MS for name, row in report["plans"].items()}
    if report["fleets"]:
        held[f"{PHONES}-phone fleet < {FLEET_TARGET_S:.0f} s"] = \
            max(report["fleets"]["seconds"]) < FLEET_TARGET_S
    return held


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per plan")
    parser.add_argument("--fleets", type=int, default=4,
                        help="fleets created one after another in one service (0: none)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where this host's calibration is (default: mebp's cache)")
    parser.add_argument("--code", type=Path, default=REPO,
                        help="the checkout whose planner and service are timed")
    parser.add_argument("--json", type=Path, help="write the whole report here")
    args = parser.parse_args()
    cache = args.cache_dir or Path(os.environ.get("MEBP_CACHE_DIR") or
                                   Path.home() / ".cache" / "mebp")
    threads = os.cpu_count() or 1  # the service plans at one thread per core
    ensure_calibration(args.code, cache, threads)
    report = {"code": str(args.code.resolve()), "threads": threads,
              "load_before": load_average(), "repeats": args.repeats}
    report["plans"] = time_plans(args.code, cache, threads, args.repeats)
    with tempfile.TemporaryDirectory(prefix="plan-speed-") as root:
        report["fleets"] = time_fleets(args.code, cache, args.fleets, Path(root)) \
            if args.fleets else None
    report["load_after"] = load_average()
    report["targets"] = targets(report)
    print("\n".join(table(report)))
    print(f"\nload average (1 min): {report['load_before']:.2f} before, "
          f"{report['load_after']:.2f} after; {args.repeats} processes per plan")
    for target, held in report["targets"].items():
        print(f"{'holds' if held else 'MISSED'}: {target}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if all(report["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
