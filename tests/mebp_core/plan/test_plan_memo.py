"""Plans are made once: asked again for the same workload, calibration, budget and device, the
planner answers with the plan it made; a new time correction or a new calibration makes a new
plan at once, and the memo is bounded."""

from __future__ import annotations

import json

import pytest

from mebp_core.config import TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import calibration_path
from mebp_core.plan.correction import record_run
from mebp_core.plan.devices import get_device
from mebp_core.plan.on_host import PLAN_MEMO_ENTRIES, _memoized_plan, plan_on_host
from mebp_core.units import MB

ARCH = load_architecture("preset:smollm2-135m")
CONFIG = TrainConfig(seq_len=128)


@pytest.fixture
def cache(tmp_path, seed_calibration):
    return seed_calibration(tmp_path / "cache")


def plan(cache, config: TrainConfig = CONFIG, **where):
    return plan_on_host(ARCH, config, cache_dir=cache, measure=False,
                        **(where or {"budget_bytes": 300 * MB}))


def test_the_same_question_is_answered_with_the_plan_already_made(cache):
    first = plan(cache)
    assert plan(cache) is first
    # anything else that determines a plan makes another
    others = [plan(cache, budget_bytes=200 * MB), plan(cache, device=get_device("pixel-8")),
              plan(cache, TrainConfig(seq_len=64)), plan(cache, TrainConfig(
                  seq_len=128, method="mezo")),
              plan_on_host(ARCH, CONFIG, budget_bytes=300 * MB, margin=0.2, cache_dir=cache,
                           measure=False),
              plan_on_host(load_architecture("preset:qwen2.5-0.5b"), CONFIG,
                           budget_bytes=300 * MB, cache_dir=cache, measure=False)]
    assert all(other is not first for other in others)
    assert len({id(other) for other in others}) == len(others)


def test_a_new_time_correction_makes_a_new_plan(cache, host):
    before = plan(cache)
    record_run(calibration_path(cache, None), host.measured_at, matmul_dtype="float32",
               modelled_s=2.0, measured_s=6.0, label="a measured run")
    after = plan(cache)
    assert after is not before
    assert after.calibration["time_correction"]["float32"]["factor"] == 3.0
    assert after.auto.prediction.step_time_s == pytest.approx(
        3.0 * before.auto.prediction.step_time_s)
    assert plan(cache) is after
    # another run moves the correction again (same calibration, same number of runs kept)
    record_run(calibration_path(cache, None), host.measured_at, matmul_dtype="float32",
               modelled_s=2.0, measured_s=2.0, label="a faster run")
    again = plan(cache)
    assert again is not after and again.calibration["time_correction"]["float32"]["runs"] == 2


def test_a_new_calibration_makes_a_new_plan(cache):
    before = plan(cache)
    path = calibration_path(cache, None)
    measured = json.loads(path.read_text())
    path.write_text(json.dumps({**measured, "measured_at": "2026-12-03T10:00:00+00:00"}))
    after = plan(cache)
    assert after is not before  # the same figures, measured again: a new provenance
    assert after.calibration["measured_at"] == "2026-12-03T10:00:00+00:00"
    faster = {**measured, "measured_at": "2026-12-03T11:00:00+00:00",
              "elementwise_bytes_per_s": 2 * measured["elementwise_bytes_per_s"]}
    path.write_text(json.dumps(faster))
    fastest = plan(cache)
    assert fastest.auto.prediction.time["elementwise"] == pytest.approx(
        before.auto.prediction.time["elementwise"] / 2)


def test_the_memo_is_bounded(cache):
    assert _memoized_plan.cache_info().maxsize == PLAN_MEMO_ENTRIES
    first = plan(cache, TrainConfig(seq_len=16))
    for seq_len in range(17, 17 + PLAN_MEMO_ENTRIES):
        plan(cache, TrainConfig(seq_len=seq_len))
    assert _memoized_plan.cache_info().currsize == PLAN_MEMO_ENTRIES
    assert plan(cache, TrainConfig(seq_len=16)) is not first  # the oldest was let go
