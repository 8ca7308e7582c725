"""The explorer's trade-off chart as a PNG, from a real `mebp serve` in Debian's chromium, and
the plan's picks at a range of budgets as a markdown table (issue 34, item 4).

    MEBP_CACHE_DIR=/tmp/front-cache nice -n 19 .venv/bin/python benchmarks/explorer_front_png.py \\
        --out docs/explorer-front-qwen2.5-0.5b-bf16.png --model preset:qwen2.5-0.5b \\
        --seq-len 256 --dtype bfloat16 --device iphone-15-pro-max

Without --url it starts `mebp serve` on a fresh data dir with no worker (the explorer only
plans), with this host's cached calibration (MEBP_CACHE_DIR, else ~/.cache/mebp; measured
first where there is none). With --device the chart's time axis and the picks rank by that
phone's estimate; without it by this host's predicted time, under --budget-mb.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlencode

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.service_load import service_at  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the PNG")
    p.add_argument("--model", default="preset:qwen2.5-0.5b")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", help="the compute dtype planned")
    p.add_argument("--device", default="", help="a device profile id (blank: this host)")
    p.add_argument("--budget-mb", type=float,
                   help="the chart's budget (default the device's; 1024 without one)")
    p.add_argument("--table-budgets", default="300,400,500,600,700,800,900,1000",
                   help="budgets (MB) whose picks the table lists")
    p.add_argument("--url", help="a running mebp serve (key: MEBP_API_KEY)")
    return p.parse_args()


def plan_query(args: argparse.Namespace, budget_mb: float | None) -> dict:
    query = {"model": args.model, "seq_len": args.seq_len, "compute_dtype": args.dtype,
             "device": args.device}
    if budget_mb is not None:
        query["budget_mb"] = f"{budget_mb:g}"
    elif not args.device:
        query["budget_mb"] = "1024"
    return query


def save_chart(url: str, key: str, query: dict, png: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=["--headless", "--no-sandbox"])
        page = browser.new_page(base_url=url, viewport={"width": 1100, "height": 900})
        page.set_default_timeout(300_000)  # a loaded host: the first plan takes a while
        page.goto("/signin")
        page.fill("input[name=api_key]", key)
        page.click("#signin button[type=submit]")
        page.goto("/explorer?" + urlencode(query))
        page.wait_for_selector("#tradeoff-chart .scatterlayer .trace")
        page.locator("#tradeoff-chart").locator("..").screenshot(path=str(png))  # and title
        browser.close()


def picks_table(client: httpx.Client, args: argparse.Namespace) -> str:
    """The fastest configuration that fits each budget (as `auto` runs), its predicted peak
    and step time on this host, and the phone's estimate with --device."""
    lines = ["| budget | chosen configuration (auto) | predicted MB | predicted s/step "
             "(this host) | est. s/step on the phone |", "|---|---|---|---|---|"]
    calibration = None
    for budget in (float(b) for b in args.table_budgets.split(",")):
        query = {k: v for k, v in plan_query(args, budget).items() if v}
        query["memory_budget_mb"] = query.pop("budget_mb")
        plan = client.get("/v1/plans", params=query)
        plan.raise_for_status()
        plan = plan.json()
        calibration = plan["calibration"]
        chosen = next((c for c in plan["configurations"] if c["id"] == plan["auto"]), None)
        if chosen is None:
            lines.append(f"| {budget:g} MB | none fits (smallest {plan['smallest_budget_mb']} "
                         "MB) | - | - | - |")
            continue
        phone = chosen["device_step_time_s_estimate"]
        lines.append(f"| {budget:g} MB | `{chosen['id']}` | {chosen['peak_mb']:.0f} | "
                     f"{chosen['step_time_s']:.2f} | "
                     f"{'-' if phone is None else f'{phone:.2f}'} |")
    load = calibration["load_average"]
    lines.append(f"\nCalibration: {calibration['host']}, {calibration['threads']} threads, "
                 f"torch {calibration['torch']}, measured {calibration['measured_at']} at "
                 f"load {load[0]:.1f} -> {load[1]:.1f}, repeats spread up to "
                 f"{calibration['max_spread']:.1f}x "
                 f"({'steady' if calibration['steady'] else 'unsteady: provisional'})")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    with service_at(args.url, 0, "mebp-explorer-") as (url, key):
        args.out.parent.mkdir(parents=True, exist_ok=True)
        save_chart(url, key, plan_query(args, args.budget_mb), args.out)
        client = httpx.Client(base_url=url, timeout=300,
                              headers={"Authorization": f"Bearer {key}"})
        print(picks_table(client, args))
        print(f"\n{args.out}: {args.out.stat().st_size / 1024:.0f} KB", file=sys.stderr)


if __name__ == "__main__":
    main()
