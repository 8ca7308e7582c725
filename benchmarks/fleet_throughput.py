"""Host time per federated round and per job: what simulating a population costs.

    .venv/bin/python benchmarks/fleet_throughput.py --phones 100 --local-steps 10 --workers 1 2
    .venv/bin/python benchmarks/fleet_throughput.py --model preset:smollm2-135m --phones 32 \\
        --local-steps 10 --workers 1 2 --json /tmp/fleet.json

For each --workers count, starts `mebp serve` with that many workers and a fresh data dir
(the cache is the user's: the host's calibration and packed models are reused), uploads
--rows-per-phone rows per phone, creates one simulated FedAvg fleet of --phones phones of
--device for --rounds rounds of --local-steps steps (every phone in every round, no
references), and waits for it. Reports each round's host seconds (the service's own
``host_wall_s``: first job claimed to global adapter scored) and seconds per job, the time
to create the fleet (the POST), and the whole run; prints a markdown table, --json the
figures. Exits 1 if a round failed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.service_load import start_service  # noqa: E402

ROUND_ENDED = {"done", "failed"}
FLEET_ENDED = {"done", "failed", "cancelled"}  # its status: nothing of it runs any more


def run_fleet(url: str, key: str, args: argparse.Namespace) -> dict:
    client = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"})
    rows = b"".join(json.dumps({"text": f"phone row {i}: " + "the quick brown fox " * 3})
                    .encode() + b"\n" for i in range(args.phones * args.rows_per_phone))
    dataset = client.post("/v1/datasets", files={"file": ("fleet.jsonl", rows)}) \
        .raise_for_status().json()["id"]
    body = {"model": args.model, "training_file": dataset,
            "simulated": {"device": args.device, "count": args.phones},
            "aggregation": "fedavg", "rounds": args.rounds, "local_steps": args.local_steps,
            "participation": 1.0, "references": False,
            "hyperparameters": {"seq_len": args.seq_len}}
    posted = time.monotonic()
    fleet = client.post("/v1/fleets", json=body)
    create_s = time.monotonic() - posted
    if fleet.status_code not in (201, 202):
        raise SystemExit(f"POST /v1/fleets: {fleet.status_code} {fleet.text[:500]}")
    fleet_id = fleet.json()["id"]
    deadline = posted + args.timeout_s
    while True:
        fleet = client.get(f"/v1/fleets/{fleet_id}").raise_for_status().json()
        rounds = fleet["rounds"]
        done = len([r for r in rounds if r["status"] in ROUND_ENDED])
        print(f"\r  {done}/{args.rounds} rounds done, {time.monotonic() - posted:.0f} s",
              end="", file=sys.stderr, flush=True)
        if fleet["status"] in FLEET_ENDED:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"\nfleet {fleet_id} not done after {args.timeout_s} s")
        time.sleep(1.0)
    print(file=sys.stderr)
    total_s = time.monotonic() - posted
    per_round = [{"index": r["index"], "status": r["status"], "host_wall_s": r["host_wall_s"],
                  "jobs": len(r["participants"]), "eval_loss": r["eval_loss"]}
                 for r in rounds]
    return {"fleet": fleet_id, "create_s": create_s, "total_s": total_s, "rounds": per_round,
            "failed": fleet["status"] == "failed"
            or any(r["status"] != "done" for r in rounds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:tiny")
    parser.add_argument("--device", default="pixel-8")
    parser.add_argument("--phones", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--rows-per-phone", type=int, default=20)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--timeout-s", type=float, default=7200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    key = "sk-mebp-bench-" + secrets.token_hex(8)
    results = []
    for workers in args.workers:
        with tempfile.TemporaryDirectory(prefix="mebp-fleet-") as tmp:
            data_dir = Path(tmp) / "data"
            data_dir.mkdir()
            process, url = start_service(data_dir, workers, key, timeout_s=1800)
            try:
                print(f"{workers} worker(s): {args.phones} phones of {args.model}",
                      file=sys.stderr)
                results.append({"workers": workers, "load_before": os.getloadavg()[0],
                                **run_fleet(url, key, args),
                                "load_after": os.getloadavg()[0]})
            finally:
                process.terminate()
                process.wait(timeout=60)
    print("| model | phones | local steps | workers | create s | round host s "
          "| s per job | whole run s | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for result in results:
        hosts = [r["host_wall_s"] for r in result["rounds"] if r["host_wall_s"] is not None]
        jobs = statistics.mean(r["jobs"] for r in result["rounds"]) or 1
        print(f"| {args.model} | {args.phones} | {args.local_steps} | {result['workers']} "
              f"| {result['create_s']:.2f} | {' / '.join(f'{h:.0f}' for h in hosts)} "
              f"| {' / '.join(f'{h / jobs:.2f}' for h in hosts)} | {result['total_s']:.0f} "
              f"| {result['load_before']:.1f}-{result['load_after']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=2))
    return 1 if any(result["failed"] for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
