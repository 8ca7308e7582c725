"""Federated fleets learn: stdlib docstrings split by package (non-IID) across 8 simulated
phones of mixed profiles (three at 512 MB), each training with the configuration the planner
picks for its budget; FedAvg and FFA over MeBP, FedAvg over MeZO at the same simulated
on-device wall-clock, beside each device training alone and one run on the union.

    .venv/bin/python benchmarks/federated.py --json /tmp/federated.json \\
        --png docs/federated-tiny.png

It holds when FedAvg's held-out loss after the last round is below the local-only mean and
within 10% of centralized training.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mebp_core.federated.simulate import (  # noqa: E402
    FederatedSpec,
    plot_federated,
    run_federated,
)

WITHIN_CENTRALIZED = 0.10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = FederatedSpec()
    p.add_argument("--model", default=defaults.model)
    p.add_argument("--rounds", type=int, default=defaults.rounds)
    p.add_argument("--local-steps", type=int, default=defaults.local_steps)
    p.add_argument("--seq-len", type=int, default=defaults.seq_len)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--mezo-lr", type=float, default=defaults.mezo_lr)
    p.add_argument("--max-corpus-files", type=int, default=defaults.max_corpus_files)
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--json", type=Path)
    p.add_argument("--png", type=Path)
    return p.parse_args(argv)


def table(report: dict) -> str:
    lines = ["| run | held-out loss after each round | final | simulated s |",
             "|---|---|---|---|"]
    for fleet in report["fleets"]:
        losses = [r["eval_loss"] for r in fleet["rounds"]]
        seconds = sum(r["simulated_wall_s"] for r in fleet["rounds"])
        lines.append(f"| {fleet['label']} | {' '.join(f'{x:.3f}' for x in losses)} | "
                     f"{losses[-1]:.4f} | {seconds:.1f} |")
    lines.append(f"| local-only, mean of {len(report['local_only'])} devices | | "
                 f"{report['local_only_mean']:.4f} | |")
    lines.append(f"| centralized, {report['centralized_steps']} steps on the union | | "
                 f"{report['centralized']:.4f} | |")
    lines.append(f"| before training | | {report['initial_loss']:.4f} | |")
    return "\n".join(lines)


def verdict(report: dict) -> tuple[bool, str]:
    fedavg = next(f for f in report["fleets"] if f["label"] == "mebp fedavg")
    final = fedavg["rounds"][-1]["eval_loss"]
    gap = final / report["centralized"] - 1
    holds = final < report["local_only_mean"] and gap <= WITHIN_CENTRALIZED
    return holds, (f"FedAvg {final:.4f} against local-only {report['local_only_mean']:.4f} "
                   f"and centralized {report['centralized']:.4f} ({gap:+.1%}): "
                   f"{'holds' if holds else 'does not hold'}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = FederatedSpec(model=args.model, rounds=args.rounds, local_steps=args.local_steps,
                         seq_len=args.seq_len, lr=args.lr, mezo_lr=args.mezo_lr,
                         max_corpus_files=args.max_corpus_files, threads=args.threads,
                         seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="mebp-federated-") as work:
        report = run_federated(spec, Path(work), log=lambda line: print(line, flush=True))
    for device in report["devices"]:
        print(f"{device['profile']}: {device['budget_mb']:.0f} MB, {device['examples']} rows, "
              f"{device['configuration']}, {device['mebp_step_s']:.3f} s/step mebp, "
              f"{device['mezo_step_s']:.3f} mezo (device estimates)")
    print(table(report))
    holds, words = verdict(report)
    print(words)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.png:
        print(plot_federated(report, args.png))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
