"""The explorer's reading of a plan, without a browser: one method's or every method's
configurations, and the recommendation naming its method and why, its knobs in that
method's own words."""

from __future__ import annotations

import pytest

from app.web.explorer import comparison_methods
from app.web.explorer_plans import plan_view
from mebp_core.config import TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.methods import METHODS, plan_methods_on_host
from mebp_core.units import MB


@pytest.fixture
def plans(seed_calibration, tmp_path):
    """Every method's plan of the tiny preset under 1 GB, as ``/v1/plans`` answers it."""
    plans = plan_methods_on_host(load_architecture("preset:tiny"), TrainConfig(seq_len=32),
                                 budget_bytes=1024 * MB, cache_dir=seed_calibration(tmp_path))
    return plans.to_json()


def test_every_method_side_by_side(plans):
    view = plan_view(plans)
    assert list(view["plans"]) == list(METHODS)
    assert {c["method"] for c in view["configurations"]} == set(METHODS)
    recommendation = view["recommendation"]
    assert recommendation["why"] == plans["recommendation"]["why"]
    assert recommendation["name"] in ("MeBP", "backprop")  # an exact method fits 1 GB here
    assert recommendation["knobs"][0].isupper()


def test_one_method_recommends_what_its_plan_recommends(plans):
    mezo = plans["plans"]["mezo"]
    view = plan_view(mezo)
    assert list(view["plans"]) == ["mezo"] and view["skipped"] == {}
    assert all(c["method"] == "mezo" for c in view["configurations"])
    recommendation = view["recommendation"]
    assert (recommendation["method"], recommendation["name"]) == ("mezo", "MeZO")
    assert recommendation["configuration"] == mezo["recommendation"]["configuration"]
    assert recommendation["why"].startswith("smallest within 3% of the fastest that fits")
    assert recommendation["why"].endswith("fits 1024 MB")
    assert recommendation["knobs"].startswith("Two forward passes with a seeded perturbation")
    assert "checkpoint" not in recommendation["knobs"]  # MeZO keeps no activations


def test_backprop_is_said_as_one_graph(plans):
    words = plan_view(plans["plans"]["backprop"])["recommendation"]["knobs"]
    assert words.startswith("One autograd graph over the whole model and the full logits")


def test_nothing_fits_means_no_recommendation(plans):
    mebp = {**plans["plans"]["mebp"], "auto": None, "recommendation": None}
    assert plan_view(mebp)["recommendation"] is None


def test_the_button_compares_mebp_and_mezo_and_the_method_shown():
    assert comparison_methods("all") == ["mebp", "mezo", "backprop"]
    assert comparison_methods("mebp") == comparison_methods("mezo") == ["mebp", "mezo"]
    assert comparison_methods("backprop") == ["mebp", "mezo", "backprop"]
