"""Side by side: rows per method, ratios against the same repeat's baseline, table and JSON."""

from __future__ import annotations

import json

import pytest

from mebp_core.bench import side_by_side
from mebp_core.bench.side_by_side import SideBySideSpec, format_table, run_side_by_side

# s/step per (method, repeat): the baseline is 2.0 then 4.0 (a slow phase of the machine)
TIMES = {"mebp": [3.0, 5.0], "mezo": [2.0, 4.0], "backprop": [1.0, 2.0], "peft": [2.0, 4.0]}


def fake_worker(calls):
    def run_worker(argv):
        method = argv[3]
        repeat = sum(1 for call in calls if call == method)
        calls.append(method)
        return {"kind": method, "s_per_step": TIMES[method][repeat], "peak_mb": 310.0,
                "peak_anon_mb": 300.0, "post_import_mb": 210.0, "footprint_mb": 100.0,
                "threads": 1}
    return run_worker


@pytest.fixture
def fake_runs(monkeypatch, tmp_path):
    calls: list[str] = []
    monkeypatch.setattr(side_by_side, "run_worker", fake_worker(calls))
    monkeypatch.setattr(side_by_side, "resolve_models",
                        lambda spec, needs_hf: (tmp_path / "packed", tmp_path / "hf"))
    return calls


def test_methods_interleave_and_ratios_use_the_same_repeats_baseline(fake_runs):
    report = run_side_by_side(SideBySideSpec(model="preset:tiny", repeats=2, cosine_seeds=0))
    assert fake_runs == ["mebp", "mezo", "backprop", "peft"] * 2
    rows = {row["method"]: row for row in report["rows"]}
    assert rows["peft"]["time_ratio_to_baseline"] == 1.0
    # per-repeat ratios 1.5 and 1.25 -> median 1.375 (not 4.0 / 3.0 of the medians)
    assert rows["mebp"]["time_ratio_to_baseline"] == pytest.approx(1.375)
    assert rows["mebp"]["s_per_step"] == 4.0 and rows["mebp"]["s_per_step_range"] == [3.0, 5.0]
    assert report["ratios"]["mebp_over_mezo_s_per_step"] == pytest.approx(1.375)
    assert report["ratios"]["mebp_over_backprop_s_per_step"] == pytest.approx(2.75)
    assert report["cosine"] is None
    json.dumps(report)


def test_without_the_baseline_there_is_no_ratio_to_it(fake_runs):
    report = run_side_by_side(SideBySideSpec(methods=("mebp", "mezo"), cosine_seeds=0))
    assert all(row["time_ratio_to_baseline"] is None for row in report["rows"])
    assert "| mebp | 310 | 100 | 3.000 | - |" in format_table(report)


def test_table_lists_every_method_with_its_ratio(fake_runs):
    table = format_table(run_side_by_side(SideBySideSpec(cosine_seeds=0)))
    assert "| transformers+PEFT bf16 | 310 | 100 | 2.000 | 1.00x |" in table
    assert "| mebp | 310 | 100 | 3.000 | 1.50x |" in table
    assert "mebp over mezo s per step: 1.50x" in table


def test_real_run_on_tiny(monkeypatch, tmp_path):
    monkeypatch.setenv("MEBP_CACHE_DIR", str(tmp_path))
    spec = SideBySideSpec(model="preset:tiny", seq_len=32, steps=2, methods=("mebp", "peft"),
                          threads=1, cosine_seeds=2)
    report = run_side_by_side(spec)
    assert [row["method"] for row in report["rows"]] == ["mebp", "peft"]
    mebp, peft = report["rows"]
    assert mebp["time_ratio_to_baseline"] == pytest.approx(mebp["s_per_step"]
                                                           / peft["s_per_step"])
    assert all(row["runs"][0]["exit_code"] == 0 for row in report["rows"])
    assert len(report["cosine"]["cosines"]) == 2
    assert "MeZO estimate vs exact LoRA gradient" in format_table(report)
    json.loads(json.dumps(report))
