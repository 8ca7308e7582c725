"""Convergence: curves from metrics, the time-to-target logic, the PNG and the command."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from mebp_core.bench import add_bench_arguments, run_bench
from mebp_core.bench.convergence import (
    CurvePoint,
    compare_curves,
    first_reaching,
    plot_curves,
    read_curve,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MEZO = [CurvePoint(0, 0.0, 6.0), CurvePoint(1000, 50.0, 5.5), CurvePoint(2000, 100.0, 5.0)]
MEBP = [CurvePoint(0, 0.0, 6.0), CurvePoint(5, 2.0, 5.2), CurvePoint(10, 4.0, 4.9),
        CurvePoint(15, 6.0, 4.5)]


def test_first_reaching_is_the_first_point_at_or_below():
    assert first_reaching(MEBP, 4.9) == MEBP[2]
    assert first_reaching(MEBP, 5.0) == MEBP[2]
    assert first_reaching(MEBP, 4.0) is None


def test_compare_curves_speedup_and_threshold():
    result = compare_curves(MEBP, MEZO)
    assert result["target_val_loss"] == 5.0 and result["mezo_wall_s"] == 100.0
    assert result["mebp_step_at_target"] == 10 and result["mebp_wall_s_at_target"] == 4.0
    assert result["wall_clock_speedup"] == 25.0 and result["step_speedup"] == 200.0
    assert result["met"]
    assert not compare_curves(MEBP, MEZO, target_speedup=30.0)["met"]


def test_compare_curves_when_mebp_never_gets_there():
    result = compare_curves(MEBP[:2], MEZO)
    assert result["mebp_step_at_target"] is None and result["wall_clock_speedup"] is None
    assert not result["met"]


def test_a_mezo_that_made_no_progress_is_reached_at_step_zero():
    flat = [CurvePoint(0, 0.0, 6.0), CurvePoint(2000, 100.0, 6.5)]
    result = compare_curves(MEBP, flat)
    assert result["mebp_step_at_target"] == 0 and math.isinf(result["wall_clock_speedup"])


def test_read_curve_accumulates_step_time_and_keeps_validated_steps(tmp_path):
    metrics = tmp_path / "m.jsonl"
    rows = [{"step": 1, "step_time_s": 0.5}, {"step": 2, "step_time_s": 0.25, "val_loss": 5.0},
            {"step": 3, "step_time_s": 1.0}, {"step": 4, "step_time_s": 0.25, "val_loss": 4.0}]
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert read_curve(metrics, 6.0) == [CurvePoint(0, 0.0, 6.0), CurvePoint(2, 0.75, 5.0),
                                        CurvePoint(4, 2.0, 4.0)]


def test_plot_writes_a_png(tmp_path):
    png = plot_curves({"mezo": MEZO, "mebp": MEBP}, compare_curves(MEBP, MEZO),
                      tmp_path / "sub" / "c.png", title="synthetic")
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.slow
def test_convergence_command_end_to_end(monkeypatch, tmp_path):
    monkeypatch.setenv("MEBP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("mebp_core.bench.convergence.ConvergenceSpec.max_corpus_files", 40)
    args = bench_args("--convergence", "--seq-len", "64", "--mezo-steps", "6",
                      "--mezo-eval-every", "3", "--mebp-steps", "6", "--mebp-eval-every", "2",
                      "--validation-chars", "3000", "--threads", "1",
                      "--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "r.json"))
    assert run_bench(args) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert [p["step"] for p in report["curves"]["mezo"]] == [0, 3, 6]
    assert [p["step"] for p in report["curves"]["mebp"]] == [0, 2, 4, 6]
    walls = [p["wall_s"] for p in report["curves"]["mebp"]]
    assert walls == sorted(walls) and walls[-1] > 0
    assert report["curves"]["mebp"][0] == report["curves"]["mezo"][0]  # the same init
    assert report["comparison"]["target_val_loss"] == report["curves"]["mezo"][-1]["val_loss"]
    assert report["curves"]["mebp"][-1]["val_loss"] < report["initial_val_loss"]
    assert (tmp_path / "work" / "convergence.png").read_bytes().startswith(PNG_MAGIC)
