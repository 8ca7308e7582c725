"""A burst of small jobs against `mebp serve`: every job must end exactly once, and the job
lookup must stay fast while the workers are busy.

    .venv/bin/python benchmarks/service_load.py --jobs 300 --workers 2 --json /tmp/load.json

Starts `mebp serve` (embedded defaults, or REDIS_URL / DATABASE_URL from the environment)
with a fresh data dir, uploads one dataset, submits --jobs one-step jobs of preset:tiny from
16 threads at once, and meanwhile has --pollers threads calling GET /v1/jobs/{id} on random
jobs, timing each call. At the end each job's events must hold exactly one start and one
terminal status: none lost, none run twice. Prints a markdown row and, with --json, the
whole report; exits 1 if any job was lost or duplicated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

TERMINAL = {"succeeded", "failed", "cancelled"}
JOB = {"model": "preset:tiny", "device": "pixel-8",
       "hyperparameters": {"steps": 1, "seq_len": 16}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(data_dir: Path, workers: int, key: str,
                  timeout_s: float = 120) -> tuple[subprocess.Popen, str]:
    """``mebp serve`` once ready (health 200: this host's calibration measured, minutes on a
    busy host where the cache has none) with ``workers`` listening."""
    port = free_port()
    env = {**os.environ, "MEBP_API_KEY": key, "HF_HUB_OFFLINE": "1"}
    log = data_dir.parent / "serve.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers",
         str(workers), "--data-dir", str(data_dir)],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url, process, log, workers, timeout_s)
    return process, url


@contextmanager
def service_at(url: str | None, workers: int, prefix: str) -> Iterator[tuple[str, str]]:
    """(url, API key): the service at ``url`` (its key in ``MEBP_API_KEY``), or a fresh
    ``mebp serve`` in a new data dir with ``workers``, stopped when the block ends."""
    if url:
        yield url, os.environ["MEBP_API_KEY"]
        return
    key = "bench-" + secrets.token_hex(12)
    data_dir = Path(tempfile.mkdtemp(prefix=prefix)) / "data"
    data_dir.mkdir()
    process, url = start_service(data_dir, workers, key, timeout_s=1800)
    try:
        yield url, key
    finally:
        process.terminate()
        process.wait(timeout=60)


def wait_until_ready(url: str, process: subprocess.Popen, log: Path, workers: int = 0,
                     timeout_s: float = 120) -> None:
    """Until the service's health is 200 (calibrated: ready or provisional) with
    ``workers`` listening; it is killed and the run ends, its log's tail shown, if not."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            health = httpx.get(url + "/v1/health", timeout=2)
            if health.status_code == 200 and health.json()["workers"] >= workers:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        if process.poll() is not None:
            break
        time.sleep(0.3)
    process.kill()
    raise SystemExit(f"mebp serve did not start:\n{log.read_text()[-3000:]}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_load(url: str, key: str, jobs: int, pollers: int) -> dict:
    client = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {key}"},
                          limits=httpx.Limits(max_connections=32))
    rows = b"".join(json.dumps({"text": f"load row {i}"}).encode() + b"\n" for i in range(8))
    dataset = client.post("/v1/datasets", files={"file": ("load.jsonl", rows)}).json()["id"]
    ids: list[str] = []
    latencies: list[float] = []
    retries: list[int] = []
    done = threading.Event()

    def submit(index: int) -> str:
        # a 503 asks to retry; the Idempotency-Key makes a retry safe
        for _ in range(10):
            response = client.post("/v1/jobs", json={**JOB, "training_file": dataset},
                                   headers={"Idempotency-Key": f"load-{index}"})
            if response.status_code != 503:
                break
            retries.append(index)
            time.sleep(float(response.headers.get("retry-after", "1")))
        response.raise_for_status()
        return response.json()["id"]

    def poll() -> None:
        while not done.is_set():
            if not ids:
                time.sleep(0.01)
                continue
            start = time.perf_counter()
            response = client.get(f"/v1/jobs/{random.choice(ids)}")
            latencies.append(time.perf_counter() - start)
            response.raise_for_status()

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(pollers)]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        for job_id in pool.map(submit, range(jobs)):
            ids.append(job_id)
    submitted = time.perf_counter() - started
    while True:
        listed = client.get("/v1/jobs", params={"limit": 1000}).json()["data"]
        if sum(job["status"] in TERMINAL for job in listed) >= jobs:
            break
        time.sleep(1)
    wall = time.perf_counter() - started
    done.set()
    for thread in threads:
        thread.join()
    return {"jobs": jobs, "submitted_s": round(submitted, 2), "wall_s": round(wall, 1),
            "statuses": count(job["status"] for job in listed),
            "listed": len(listed), "submit_retries": len(retries), **exactly_once(client, ids),
            "get_job_calls": len(latencies),
            "get_job_p50_ms": round(1000 * statistics.median(latencies), 1),
            "get_job_p99_ms": round(1000 * percentile(latencies, 0.99), 1),
            "get_job_max_ms": round(1000 * max(latencies), 1)}


def exactly_once(client: httpx.Client, ids: list[str]) -> dict:
    """Jobs whose events do not show one start and one end, and ids submitted twice."""
    lost, duplicated = [], []
    for job_id in ids:
        events = client.get(f"/v1/jobs/{job_id}/events").json()
        statuses = [e["data"].get("status") for e in events if e["kind"] == "status"]
        ends = sum(status in TERMINAL for status in statuses)
        starts = statuses.count("running")
        if ends == 0:
            lost.append(job_id)
        elif ends > 1 or starts > 1:
            duplicated.append(job_id)
    return {"lost": lost, "duplicated": duplicated, "distinct_ids": len(set(ids))}


def count(values) -> dict:
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pollers", type=int, default=4)
    parser.add_argument("--json", type=Path, help="write the whole report here")
    args = parser.parse_args()
    key = "load-" + secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="mebp-load-") as tmp:
        process, url = start_service(Path(tmp) / "data", args.workers, key)
        try:
            report = run_load(url, key, args.jobs, args.pollers)
        finally:
            process.terminate()
            process.wait(timeout=60)
    report["workers"] = args.workers
    print(json.dumps(report, indent=2))
    print(f"| {report['jobs']} | {args.workers} | {report['wall_s']} | "
          f"{report['statuses']} | {len(report['lost'])} | {len(report['duplicated'])} | "
          f"{report['get_job_calls']} | {report['get_job_p50_ms']} | {report['get_job_p99_ms']} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    ok = not report["lost"] and not report["duplicated"] and report["listed"] == args.jobs \
        and report["distinct_ids"] == args.jobs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
