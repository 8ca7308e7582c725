"""A comparison end to end against `mebp serve`: upload a training and a validation JSONL,
POST /v1/comparisons, follow it to its end, print its runs as a markdown table with its
sentence, and save the comparison page's chart as a PNG (Debian's chromium via Playwright).

    .venv/bin/python benchmarks/comparison.py --model preset:NAME --device iphone-15-pro-max \\
        --train train.jsonl --valid valid.jsonl --max-device-time-s 600 \\
        --rates mebp=1e-3,1e-2 --rates mezo=1e-4,1e-3 --seq-len 128 \\
        --png comparison.png --json comparison.json

Without --url it starts `mebp serve` on a fresh data dir (--workers, a fresh key); with --url
the key comes from MEBP_API_KEY.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.service_load import service_at  # noqa: E402

NAMES = {"mebp": "MeBP", "mezo": "MeZO", "backprop": "backprop"}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--train", type=Path, required=True, help="training JSONL")
    p.add_argument("--valid", type=Path, required=True, help="validation JSONL")
    p.add_argument("--methods", default="mebp,mezo")
    p.add_argument("--rates", action="append", default=[], metavar="METHOD=LR,LR",
                   help="a method's learning rates (repeat per method; default the API's)")
    limit = p.add_mutually_exclusive_group(required=True)
    limit.add_argument("--max-steps", type=int)
    limit.add_argument("--max-device-time-s", type=float)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--hyperparameters", type=json.loads, default={},
                   help="other shared hyperparameters, as JSON")
    p.add_argument("--memory-budget-mb", type=float)
    p.add_argument("--url", help="a running mebp serve (key: MEBP_API_KEY)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=6 * 3600)
    p.add_argument("--png", type=Path, help="the chart of validation loss in phone time")
    p.add_argument("--json", type=Path, help="the comparison as GET /v1/comparisons/{id}")
    return p.parse_args()


def request_body(args: argparse.Namespace, train: str, valid: str) -> dict:
    rates = {}
    for item in args.rates:
        method, _, values = item.partition("=")
        rates[method] = [float(v) for v in values.split(",")]
    body = {"model": args.model, "device": args.device, "training_file": train,
            "validation_file": valid, "methods": args.methods.split(","),
            "learning_rates": rates, "max_steps": args.max_steps,
            "max_device_time_s": args.max_device_time_s, "eval_every": args.eval_every,
            "memory_budget_mb": args.memory_budget_mb,
            "hyperparameters": {"seq_len": args.seq_len, **args.hyperparameters}}
    return {k: v for k, v in body.items() if v is not None}


def follow(client: httpx.Client, comparison_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        body = client.get(f"/v1/comparisons/{comparison_id}").json()
        if body["summary"] != last:
            print(f"[{time.strftime('%H:%M:%S')}] {body['summary']}", file=sys.stderr)
            last = body["summary"]
        if body["status"] == "done":
            return body
        if time.monotonic() > deadline:
            raise SystemExit(f"comparison {comparison_id} not done in {timeout_s} s")
        time.sleep(5)


def markdown(body: dict) -> str:
    lines = ["| method | lr | status | steps | s/step on the phone (est.) | best val loss | "
             "at phone time (s) | final val loss | peak MB predicted / measured |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method in body["methods"]:
        if not method["runs"]:
            lines.append(f"| {NAMES[method['method']]} | - | {method['verdict']} | - | - | - | "
                         f"- | - | {method['reason']} |")
        for run in method["runs"]:
            best = min(run["curve"], key=lambda p: p["val_loss"], default=None)
            at = "-" if best is None or best["device_time_s"] is None else \
                f"{best['device_time_s']:.1f}"
            star = " (best)" if run["job_id"] == method["best_job_id"] else ""
            status = run["status"] + (f" ({run['error']['code']})" if run["error"] else "")
            lines.append(
                f"| {NAMES[run['method']]}{star} | {run['learning_rate']:g} | {status} | "
                f"{run['step']} | {run['device_step_time_s_estimate']} | "
                f"{_fmt(run['best_val_loss'])} | {at} | {_fmt(run['final_val_loss'])} | "
                f"{run['predicted_peak_mb']} / {run['measured_peak_mb']} |")
    return "\n".join(lines) + f"\n\n{body['summary']}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def save_chart(url: str, key: str, comparison_id: str, png: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=["--headless", "--no-sandbox"])
        page = browser.new_page(base_url=url, viewport={"width": 1280, "height": 900})
        page.set_default_timeout(300_000)  # a loaded host: sign-in lands on the explorer
        page.goto("/signin")
        page.fill("input[name=api_key]", key)
        page.click("#signin button[type=submit]")
        page.goto(f"/comparisons/{comparison_id}")
        page.wait_for_selector("#curve-chart .scatterlayer .trace")
        page.locator("#curve-chart").locator("..").screenshot(path=str(png))  # with its title
        browser.close()


def main() -> None:
    args = parse_args()
    with service_at(args.url, args.workers, "mebp-comparison-") as (url, key):
        client = httpx.Client(base_url=url, timeout=120,
                              headers={"Authorization": f"Bearer {key}"})
        ids = {}
        for name, path in (("train", args.train), ("valid", args.valid)):
            answer = client.post("/v1/datasets", files={"file": (path.name, path.read_bytes())})
            answer.raise_for_status()
            ids[name] = answer.json()["id"]
        made = client.post("/v1/comparisons", json=request_body(args, ids["train"],
                                                                ids["valid"]))
        if made.status_code != 201:
            raise SystemExit(f"POST /v1/comparisons: {made.status_code} {made.text}")
        body = follow(client, made.json()["id"], args.timeout_s)
        print(markdown(body))
        if args.json:
            args.json.write_text(json.dumps(body, indent=1))
        if args.png:
            save_chart(url, key, body["id"], args.png)


if __name__ == "__main__":
    main()
