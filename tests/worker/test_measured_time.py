"""A finished job's measured step time corrects this host's plans, unless it is so far from
the model that it says more about the run than the host; either way the job says so."""

from __future__ import annotations

import pytest

from mebp_core.plan.calibration import load_calibration
from mebp_core.plan.correction import RATIO_BOUNDS
from mebp_core.plan.summary import PlanSummary
from service.models import Job
from worker.measured_time import correct_host_time


def finished_job(modelled_s: float, measured_s: float, calibration: dict) -> Job:
    plan = PlanSummary(
        configuration="c1", feasible=True, budget_mb=1024.0, margin=0.1,
        matmul_dtype="float32", predicted_peak_mb=100.0, predicted_memory_mb={"weights": 100.0},
        predicted_step_time_s=modelled_s, modelled_step_time_s=modelled_s,
        modelled_time_s={"matmul": modelled_s}, smallest_budget_mb=111,
        smallest_configuration="c1", dominant_component="weights", calibration=calibration)
    return Job(id="j1", tenant="t", status="succeeded", model="preset:tiny",
               memory_budget_bytes=1 << 30, config={}, plan=plan, training_file="d1",
               step_time_s=measured_s)


@pytest.fixture
def cache(tmp_path, seed_calibration):
    return seed_calibration(tmp_path / "cache", threads=1)


def test_a_run_near_the_model_corrects_the_next_plans(cache):
    calibration = load_calibration(cache, 1, measure=False)
    job = finished_job(0.5, 0.75, calibration.provenance())
    message, data = correct_host_time(job, cache_dir=cache, threads=1)
    assert data["time_correction"]["factor"] == pytest.approx(1.5)
    assert "this configuration to 0.75 s/step (x1.50 its model" in message
    after = load_calibration(cache, 1, measure=False).time_corrections["float32"]
    assert after.factor == pytest.approx(1.5) and after.runs == 1


def test_a_run_far_off_the_model_is_said_and_not_recorded(cache):
    calibration = load_calibration(cache, 1, measure=False)
    far = RATIO_BOUNDS[1] * 1.1
    job = finished_job(0.01, 0.01 * far, calibration.provenance())
    message, data = correct_host_time(job, cache_dir=cache, threads=1)
    assert "time_correction" not in data and "not used to correct" in message
    assert f"{far:.3g}x the model" in message
    assert load_calibration(cache, 1, measure=False).time_corrections == {}


def test_a_job_planned_against_another_calibration_corrects_nothing(cache):
    calibration = load_calibration(cache, 1, measure=False).provenance()
    job = finished_job(0.5, 0.75, {**calibration, "measured_at": "2020-01-01T00:00:00+00:00"})
    assert correct_host_time(job, cache_dir=cache, threads=1) is None
    assert load_calibration(cache, 1, measure=False).time_corrections == {}
