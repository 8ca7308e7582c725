"""The host's step-time correction: the median of its latest runs' measured/modelled ratios,
per matmul dtype and per calibration, applied by every plan made with that calibration."""

from __future__ import annotations

import json

import pytest

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import calibration_path, load_calibration
from mebp_core.plan.correction import (
    RECENT_RUNS,
    correction_path,
    measured_step_time,
    record_run,
)
from mebp_core.plan.predict import predict
from mebp_core.plan.workload import Workload


def record(cache, at: str, ratio: float, dtype: str = "float32"):
    return record_run(calibration_path(cache, None), at, matmul_dtype=dtype, modelled_s=2.0,
                      measured_s=2.0 * ratio, label="test")


def test_a_run_is_its_steps_after_the_first():
    assert measured_step_time([9.0, 1.0, 3.0, 2.0]) == 2.0
    assert measured_step_time([9.0]) is None


def test_the_correction_is_the_median_of_the_latest_runs_per_dtype(tmp_path, seed_calibration,
                                                                    host):
    cache = seed_calibration(tmp_path)
    at = host.measured_at
    assert load_calibration(cache).time_corrections == {}
    assert record(cache, at, 3.0).factor == pytest.approx(3.0)
    ratios = [3.0, 1.0, 1.2, 1.1, 0.9, 1.3]  # the first falls out of the window
    for ratio in ratios[1:]:
        correction = record(cache, at, ratio)
    assert correction.runs == RECENT_RUNS
    assert correction.factor == pytest.approx(1.1)
    record(cache, at, 0.5, dtype="bfloat16")
    loaded = load_calibration(cache)
    assert loaded.time_factor("float32") == pytest.approx(1.1)
    assert loaded.time_factor("bfloat16") == pytest.approx(0.5)
    assert record(cache, at, 1000.0) is None  # not a statement about the host

    # every plan's step time moves by the factor; memory does not
    workload = Workload(arch=load_architecture("preset:tiny"), seq_len=64)
    plain = predict(workload, EngineKnobs(), host)
    corrected = predict(workload, EngineKnobs(), loaded)
    assert corrected.step_time_s == pytest.approx(plain.step_time_s * 1.1)
    assert corrected.modelled_step_time_s == pytest.approx(plain.step_time_s)
    assert corrected.memory == plain.memory


def test_a_new_calibration_starts_uncorrected_and_a_corrupt_record_is_ignored(
        tmp_path, seed_calibration, host):
    cache = seed_calibration(tmp_path)
    record(cache, "2026-01-01T00:00:00+00:00", 2.0)  # runs against an earlier calibration
    assert load_calibration(cache).time_corrections == {}
    correction_path(calibration_path(cache, None)).write_text("{not json")
    assert load_calibration(cache).time_corrections == {}
    assert record(cache, host.measured_at, 2.0).runs == 1
    assert json.loads(correction_path(calibration_path(cache, None)).read_text())[0]["ratio"] == 2.0
