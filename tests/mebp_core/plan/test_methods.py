"""Every method planned: MeZO's and plain backprop's own memory and passes beside MeBP's, the
side-by-side plan and its recommendation, and the paper's phone figures through `mebp plan`."""

from __future__ import annotations

import json

import pytest

from benchmarks.device_estimates import MEBP_PAPER, estimate
from mebp_core.cli import main
from mebp_core.config import TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.grid import candidate_knobs
from mebp_core.plan.methods import MethodSettingError, plan_methods_on_host
from mebp_core.plan.passes import pass_counts
from mebp_core.plan.planner import knobs_id, make_plan
from mebp_core.plan.predict import full_logits_bytes, predict
from mebp_core.plan.workload import Workload
from mebp_core.units import MB

QWEN = "preset:qwen2.5-0.5b"


@pytest.fixture
def cached_host(seed_calibration, tmp_path, monkeypatch):
    monkeypatch.setenv("MEBP_CACHE_DIR", str(tmp_path))
    return seed_calibration(tmp_path)


def default_prediction(method: str, host, seq_len: int = 256):
    config = TrainConfig(method=method, seq_len=seq_len)
    return predict(Workload.from_config(load_architecture(QWEN), config), config.knobs, host)


def test_mezo_holds_what_inference_holds(host):
    """No checkpoints, no saved activations, no gradients or optimizer state: the LoRA
    parameters, one block's forward temporaries and the head's loss tiles."""
    mezo, mebp = default_prediction("mezo", host), default_prediction("mebp", host)
    assert mezo.memory["checkpoints"] == 0
    assert mezo.memory["activations"] < mebp.memory["activations"]
    assert mezo.memory["lora"] < mebp.memory["lora"]
    assert mezo.peak_bytes < mebp.peak_bytes
    # its forwards' memory grows with the tokens, but not with a graph kept for a backward
    longer = default_prediction("mezo", host, seq_len=1024)
    assert longer.memory["activations"] > mezo.memory["activations"]
    assert longer.peak_bytes < default_prediction("mebp", host, seq_len=1024).peak_bytes


def test_backprop_holds_every_activation_the_whole_model_and_the_full_logits(host):
    backprop, mebp = default_prediction("backprop", host), default_prediction("mebp", host)
    arch = load_architecture(QWEN)
    assert backprop.memory["loss_chunk"] == full_logits_bytes(
        Workload(arch=arch, seq_len=256, method="backprop"))
    assert backprop.memory["loss_chunk"] > 3 * 256 * arch.vocab_size * 4 - 1
    frozen = sum(params for _, params in arch.frozen_weights()) * 4
    assert backprop.memory["weights"] >= frozen  # all of it resident
    assert backprop.peak_bytes > 3 * mebp.peak_bytes


def test_each_method_plans_only_the_knobs_it_uses():
    arch = load_architecture(QWEN)
    mezo = candidate_knobs(Workload(arch=arch, seq_len=256, method="mezo"))
    assert {k.checkpoint_blocks for k in mezo} == {1} and {k.lora_hidden for k in mezo} == {
        "recompute"}
    assert {k.frozen_weights for k in mezo} == {"lazy", "resident"}
    ids = [knobs_id(k, "mezo") for k in mezo]
    assert len(set(ids)) == len(ids) and all(i.startswith("mezo-") for i in ids)
    [backprop] = candidate_knobs(Workload(arch=arch, seq_len=256, method="backprop"))
    assert backprop.checkpoint_blocks == "none" and backprop.frozen_weights == "resident"
    assert knobs_id(backprop, "backprop") == "backprop"


def test_mezo_runs_two_forwards_and_no_backward():
    arch = load_architecture(QWEN)
    passes = pass_counts(Workload(arch=arch, seq_len=256, method="mezo"),
                         TrainConfig(method="mezo").knobs)
    assert passes["tiled_forward"] == 2 * arch.num_layers
    assert passes["tiled_backward"] == passes["whole_backward"] == 0


def test_all_methods_side_by_side_with_a_recommendation(cached_host):
    arch = load_architecture(QWEN)
    plans = plan_methods_on_host(arch, TrainConfig(seq_len=256), budget_bytes=1024 * MB)
    assert set(plans.plans) == {"mebp", "mezo", "backprop"} and plans.skipped == {}
    assert plans.plans["backprop"].auto is None  # a phone budget kills plain backprop
    best = plans.recommendation()
    assert best["method"] == "mebp" and "exact" in best["why"]
    assert best["configuration"] == plans.plans["mebp"].recommended().id
    # a budget only MeZO fits: it is recommended, saying so
    smallest_mezo = plans.plans["mezo"].smallest_budget_mb()
    assert smallest_mezo < plans.plans["mebp"].smallest_budget_mb()
    tight = plan_methods_on_host(arch, TrainConfig(seq_len=256),
                                 budget_bytes=smallest_mezo * MB)
    assert tight.recommendation()["method"] == "mezo"
    assert "only method that fits" in tight.recommendation()["why"]


def test_a_setting_a_method_cannot_take_is_skipped_or_refused(cached_host):
    arch = load_architecture(QWEN)
    adamw = TrainConfig(seq_len=256, optimizer="adamw")
    plans = plan_methods_on_host(arch, adamw)
    assert set(plans.plans) == {"mebp", "backprop"} and "sgd" in plans.skipped["mezo"]
    with pytest.raises(MethodSettingError, match="method mezo"):
        plan_methods_on_host(arch, adamw, ("mezo",))


def test_jobs_plan_mezo_with_the_knobs_it_runs(host):
    """A plan's MeZO configuration is what the engine runs: its knobs validate as a
    TrainConfig of method mezo."""
    arch = load_architecture(QWEN)
    plan = make_plan(Workload(arch=arch, seq_len=256, method="mezo"), host,
                     budget_bytes=400 * MB)
    assert plan.auto is not None and plan.auto.method == "mezo"
    TrainConfig(method="mezo", knobs=plan.auto.knobs)
    assert plan.to_json()["method"] == "mezo"
    assert all(c["method"] == "mezo" for c in plan.to_json()["configurations"])


@pytest.mark.parametrize("method", ["mebp", "mezo"])
@pytest.mark.parametrize("model", sorted(MEBP_PAPER))
def test_mebp_plan_gives_the_paper_figures_the_benchmark_prints(cached_host, capsys, model,
                                                                method):
    """`mebp plan --method M --device iphone-15-pro-max` prints, for the paper's
    configuration, the figure benchmarks/device_estimates.py prints (uncapped: the budget
    is the phone's RAM, so the store is never re-read)."""
    paper_id = {"mebp": "lazy-ckpt1-ram-h-store-shared-tile8M",
                "mezo": "mezo-lazy-tile8M"}[method]
    assert main(["plan", "--model", f"preset:{model}", "--method", method, "--device",
                 "iphone-15-pro-max", "--budget-mb", "8192", "--seq-len", "256",
                 "--compute-dtype", "bfloat16", "--bf16-matmul", "native", "--all",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    [paper] = [c for c in plan["configurations"] if c["id"] == paper_id]
    figure = sum(estimate("iphone-15-pro-max", model, method).values())
    assert paper["device_step_time_s_estimate"] == pytest.approx(figure, abs=1e-3)


def test_mebp_plan_all_prints_each_method_and_the_recommendation(cached_host, capsys):
    assert main(["plan", "--model", QWEN, "--method", "all", "--device",
                 "iphone-15-pro-max"]) == 0
    out = capsys.readouterr().out
    assert "== MeBP ==" in out and "== MeZO ==" in out and "== backprop ==" in out
    assert "recommended: MeBP" in out
    assert main(["plan", "--model", QWEN, "--method", "all", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert plans["method"] == "all" and set(plans["plans"]) == {"mebp", "mezo", "backprop"}
    with pytest.raises(SystemExit):
        main(["plan", "--model", QWEN, "--method", "sgd"])
    assert "invalid choice: 'sgd'" in capsys.readouterr().err
