"""A job's plan summary: the keys every writer gives it, rows of older versions loading with
defaults, and a renamed or mistyped key refused by name."""

from __future__ import annotations

import pytest
from plan_rows import FIRST_ROW
from pydantic import ValidationError

from mebp_core.config import TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.on_host import chosen_entry, plan_on_host, plan_summary
from mebp_core.plan.summary import PlanSummary, Replanned
from mebp_core.units import MB

# the keys of the dict plan_summary returned before it was a model, in order
KEYS = ["planned", "method", "configuration", "feasible", "chosen_by", "budget_mb", "margin",
        "matmul_dtype", "predicted_peak_mb", "predicted_memory_mb", "predicted_step_time_s",
        "modelled_step_time_s", "modelled_time_s", "time_correction",
        "device_step_time_s_estimate", "smallest_budget_mb", "smallest_configuration",
        "dominant_component", "calibration"]


@pytest.fixture
def summary(tmp_path, seed_calibration) -> PlanSummary:
    cache = seed_calibration(tmp_path / "cache", threads=1)
    plan = plan_on_host(load_architecture("preset:tiny"), TrainConfig(seq_len=32).model_copy(
        update={"knobs": TrainConfig().knobs.model_copy(update={"threads": 1})}),
        budget_bytes=400 * MB, cache_dir=cache, measure=False)
    return plan_summary(plan, chosen_entry(plan), chosen_by="auto")


def test_its_json_has_the_keys_the_dict_had_and_the_workers_only_once_set(summary):
    assert list(summary.model_dump(mode="json")) == KEYS
    by_worker = summary.model_copy(update={"predicted_by": "w1", "replanned": Replanned(
        reason="r", previous_configuration="c", worker="w1", attempt=2)})
    assert list(by_worker.model_dump(mode="json")) == [*KEYS, "predicted_by", "replanned"]
    assert PlanSummary.model_validate(by_worker.model_dump(mode="json")) == by_worker


def test_a_row_of_the_first_version_loads_with_the_later_keys_defaulted():
    summary = PlanSummary.model_validate(FIRST_ROW)
    assert summary.method == "mebp" and summary.chosen_by == "auto"
    assert summary.modelled_step_time_s is None and summary.calibrated_at is None
    assert summary.predicted_by is None and summary.replanned is None


@pytest.mark.parametrize(("row", "field"), [
    ({**{k: v for k, v in FIRST_ROW.items() if k != "smallest_budget_mb"},
      "smallest_budget": 276}, "smallest_budget_mb"),  # renamed: the missing key is named
    # (an added key is ignored: a row a newer version wrote loads in an older one)
    ({**FIRST_ROW, "predicted_peak_mb": "a lot"}, "predicted_peak_mb"),
    ({**FIRST_ROW, "chosen_by": "planner"}, "chosen_by"),
])
def test_a_renamed_or_mistyped_key_is_refused_by_name(row, field):
    with pytest.raises(ValidationError) as caught:
        PlanSummary.model_validate(row)
    assert field in {str(error["loc"][0]) for error in caught.value.errors()}
