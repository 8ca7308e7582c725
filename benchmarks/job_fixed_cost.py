"""A job's fixed cost: what a worker spends on a job beyond its training steps.

    .venv/bin/python benchmarks/job_fixed_cost.py --jobs 12 --json /tmp/fixed.json

Starts `mebp serve` with one worker and a fresh data dir (the cache is the user's, so the
host's calibration and the packed tiny preset are reused), then runs --jobs jobs of
preset:tiny, --steps steps each, one after another. A job's fixed cost is the time from a
worker claiming it (``started_at``) to its adapter being recorded (``finished_at``, set in
the same commit) minus the sum of its measured steps (``step_time_s`` of its metrics).
The first job is reported apart (it may pack the model and warm the worker). Prints a
markdown row; --json writes every job's figures.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.service_load import start_service  # noqa: E402

TERMINAL = {"succeeded", "failed", "cancelled"}


def run_job(client: httpx.Client, dataset: str, steps: int, timeout_s: float) -> dict:
    job = client.post("/v1/jobs", json={
        "model": "preset:tiny", "device": "pixel-8", "training_file": dataset,
        "hyperparameters": {"steps": steps, "seq_len": 32}}).raise_for_status().json()
    deadline = time.monotonic() + timeout_s
    while (job := client.get(f"/v1/jobs/{job['id']}").json())["status"] not in TERMINAL:
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job['id']} still {job['status']} after {timeout_s} s")
        time.sleep(0.05)
    if job["status"] != "succeeded":
        raise SystemExit(f"job {job['id']} {job['status']}: {job.get('error')}")
    metrics = client.get(f"/v1/jobs/{job['id']}/metrics", params={"limit": 1000}).json()["data"]
    steps_s = sum(m["data"]["step_time_s"] for m in metrics
                  if m["data"].get("step_time_s") is not None)
    held = (datetime.fromisoformat(job["finished_at"])
            - datetime.fromisoformat(job["started_at"])).total_seconds()
    queued = (datetime.fromisoformat(job["started_at"])
              - datetime.fromisoformat(job["created_at"])).total_seconds()
    started = datetime.fromisoformat(job["started_at"])
    timeline = [(round((datetime.fromisoformat(event["at"]) - started).total_seconds(), 3),
                 event["message"][:60])
                for event in client.get(f"/v1/jobs/{job['id']}/events").json()]
    timeline += [(round((datetime.fromisoformat(m["at"]) - started).total_seconds(), 3),
                  f"step {m['step']} recorded") for m in metrics[:1] + metrics[-1:]]
    return {"id": job["id"], "held_s": held, "steps_s": steps_s, "fixed_s": held - steps_s,
            "queued_s": queued, "timeline": sorted(timeline)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    key = "sk-mebp-bench-" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="mebp-fixed-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        process, url = start_service(data_dir, 1, key, timeout_s=1800)
        try:
            client = httpx.Client(base_url=url, timeout=60,
                                  headers={"Authorization": f"Bearer {key}"})
            rows = b"".join(json.dumps({"text": f"fixed cost row {i} " * 4}).encode() + b"\n"
                            for i in range(32))
            dataset = client.post("/v1/datasets", files={"file": ("rows.jsonl", rows)}) \
                .raise_for_status().json()["id"]
            jobs = [run_job(client, dataset, args.steps, 600) for _ in range(args.jobs)]
        finally:
            process.terminate()
            process.wait(timeout=30)
    later = [job["fixed_s"] for job in jobs[1:]]
    report = {"jobs": jobs, "first_fixed_s": jobs[0]["fixed_s"],
              "median_fixed_s": statistics.median(later),
              "min_fixed_s": min(later), "max_fixed_s": max(later),
              "median_steps_s": statistics.median(job["steps_s"] for job in jobs[1:])}
    print("| jobs | steps | first job fixed s | median fixed s | min | max | median steps s |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.jobs} | {args.steps} | {report['first_fixed_s']:.2f} | "
          f"{report['median_fixed_s']:.2f} | {report['min_fixed_s']:.2f} | "
          f"{report['max_fixed_s']:.2f} | {report['median_steps_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
