"""A service's start and its processes at rest: `mebp serve --workers 1` on a fresh data dir
(the cache is the user's, so the host's calibration is reused), timed from the spawn until
its health answers and until it is ready (calibrated, the worker listening); then, 2 s on,
each process of its tree but Redis with the kernel's count of it (anonymous + shared memory, from
/proc/PID/status), its RSS and whether it maps libtorch.

    .venv/bin/python benchmarks/service_start.py --starts 3

Run it from each checkout to compare two (the code that runs is the working directory's).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.service_load import free_port  # noqa: E402

SETTLE_S = 2.0


def charged_mb(pid: int) -> int:
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (int(fields["RssAnon"].split()[0]) + int(fields["RssShmem"].split()[0])) >> 10


def one_start(timeout_s: float) -> dict:
    port, key = free_port(), "bench-" + secrets.token_hex(12)
    root = Path(tempfile.mkdtemp(prefix="mebp-start-"))
    env = {**os.environ, "MEBP_API_KEY": key, "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    with open(root / "serve.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers", "1",
             "--data-dir", str(root / "data")], stdout=log, stderr=subprocess.STDOUT, env=env)
    answered = None
    try:
        while process.poll() is None and time.monotonic() - started < timeout_s:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=5).json()
                answered = answered or time.monotonic() - started
                workers = health.get("workers") or 0  # None until Redis answers
                if health["calibration"] in ("ready", "provisional") and workers >= 1:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        else:
            raise SystemExit(f"mebp serve was not ready:\n{(root / 'serve.log').read_text()}")
        ready = time.monotonic() - started
        time.sleep(SETTLE_S)
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
        processes = [{"command": " ".join(p.cmdline()[2:])[:60], "charged_mb": charged_mb(p.pid),
                      "rss_mb": p.memory_info().rss >> 20,
                      "torch": "libtorch_cpu" in Path(f"/proc/{p.pid}/maps").read_text()}
                     for p in tree if "redis" not in p.name()]
    finally:
        process.terminate()
        process.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    return {"answered_s": answered, "ready_s": ready, "processes": processes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    starts = [one_start(args.timeout_s) for _ in range(args.starts)]
    for start in starts:
        print(f"health answered {start['answered_s']:.2f} s, ready {start['ready_s']:.2f} s")
    print(f"median: answered {statistics.median(s['answered_s'] for s in starts):.2f} s, "
          f"ready {statistics.median(s['ready_s'] for s in starts):.2f} s")
    print("| process | charged MB | RSS MB | torch |\n|---|---:|---:|---|")
    for p in starts[-1]["processes"]:
        print(f"| `{p['command']}` | {p['charged_mb']} | {p['rss_mb']} | "
              f"{'yes' if p['torch'] else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(starts, indent=1))


if __name__ == "__main__":
    main()
