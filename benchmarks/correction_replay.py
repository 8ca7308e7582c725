"""Replay the host's time correction on recorded ``mebp bench --plan-check --learn`` reports.

Each report is one learning sequence (plan-check starts from an empty correction): row i's
prediction is replayed from rows 0..i-1 recorded as a finished job records itself
(``correction.record_run``), so a change to ``mebp_core.plan.correction`` can be scored on
every table measured so far before it is measured live. Scores count the rows after the
first within 25% of their measured step time.

    .venv/bin/python benchmarks/correction_replay.py benchmarks/results/plan-check/*.json

Pure arithmetic on the recorded figures: no torch, seconds to run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mebp_core.plan.correction import correction_from  # noqa: E402

TOLERANCE = 0.25


def run_record(row: dict) -> dict:
    """A plan-check row as the correction file records a finished run."""
    record = {"matmul_dtype": _dtype(row), "label": row["config"],
              "modelled_s": uncorrected([], row), "measured_s": row["measured_s"],
              "ratio": row["measured_s"] / uncorrected([], row),
              "modelled_parts": row["modelled_time_s"]}
    if row.get("measured_decompress_s") is not None:
        record["measured_parts"] = {"decompress": row["measured_decompress_s"]}
    return record


def corrected(runs: list[dict], row: dict) -> float:
    """The step time the current correction predicts for ``row`` after ``runs``."""
    same = _same_dtype(runs, row)
    if not same:
        return uncorrected(runs, row)
    return sum(correction_from(same, _dtype(row)).apply(row["modelled_time_s"]).values())


def one_factor(runs: list[dict], row: dict) -> float:
    """The prior alone: one factor for every part."""
    same = _same_dtype(runs, row)
    factor = correction_from(same, _dtype(row)).factor if same else 1.0
    return factor * uncorrected(runs, row)


def uncorrected(runs: list[dict], row: dict) -> float:
    """The model alone."""
    return sum(row["modelled_time_s"].values())


def _dtype(row: dict) -> str:
    return row.get("matmul_dtype", "?")  # reports before it was kept: one dtype a table


def _same_dtype(runs: list[dict], row: dict) -> list[dict]:
    """The runs a plan of ``row`` is corrected by: corrections are kept per matmul dtype."""
    return [r for r in runs if r["matmul_dtype"] == _dtype(row)]


PREDICTORS: dict[str, Callable[[list[dict], dict], float]] = {
    "corrected": corrected, "one factor": one_factor, "uncorrected": uncorrected}


def replay(rows: list[dict], predict: Callable[[list[dict], dict], float]) -> list[float]:
    """Each row's relative error after the first, predicted from the rows before it."""
    runs, errors = [], []
    for i, row in enumerate(rows):
        if i:
            errors.append(predict(runs, row) / row["measured_s"] - 1)
        runs.append(run_record(row))
    return errors


def score(errors: list[float]) -> str:
    return f"{sum(abs(e) <= TOLERANCE for e in errors)}/{len(errors)}"


def print_table(report: dict) -> None:
    """The report as BENCHMARKS.md tabulates it: each prediction as made live, the prior
    alone and the model alone beside it."""
    print("| model | configuration | MB pred | MB meas | s pred | s meas | error | one factor "
          "| uncorrected |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in report["rows"]:
        print(f"| {row['model'].removeprefix('preset:')} | {row['config']} | "
              f"{row['predicted_peak_mb']:.0f} | {row['measured_peak_mb']:.0f} | "
              f"{row['predicted_s']:.2f} | {row['measured_s']:.2f} | {row['time_error']:+.0%} | "
              f"{row['time_error_one_factor']:+.0%} | "
              f"{uncorrected([], row) / row['measured_s'] - 1:+.0%} |")
    print(f"\nmemory within 15%: {report['memory_within']}; time within 25% after the first "
          f"run: {report.get('time_within_corrected')} (one factor "
          f"{report.get('time_within_corrected_one_factor')}); uncorrected: "
          f"{score(replay(report['rows'], uncorrected))}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--rows", action="store_true", help="print every row's errors")
    parser.add_argument("--tables", action="store_true",
                        help="print each report's live predicted-against-measured table")
    args = parser.parse_args()
    if args.tables:
        for path in args.reports:
            print(f"{path.name}:\n")
            print_table(json.loads(path.read_text()))
    print("| report | " + " | ".join(PREDICTORS) + " |")
    print("|---|" + "---|" * len(PREDICTORS))
    for path in args.reports:
        rows = json.loads(path.read_text())["rows"]
        errors = {name: replay(rows, predict) for name, predict in PREDICTORS.items()}
        print(f"| {path.name} | " + " | ".join(score(e) for e in errors.values()) + " |")
        if args.rows:
            for row, *errs in zip(rows[1:], *errors.values(), strict=True):
                print(f"|   {row['model']} {row['config']} | "
                      + " | ".join(f"{e:+.0%}" for e in errs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
