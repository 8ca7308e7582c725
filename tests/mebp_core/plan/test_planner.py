"""The planner's choices on a fixed host: the grid of candidate knobs, the Pareto front,
feasibility, ``auto``, the recommendation and the smallest budget."""

from __future__ import annotations

import pytest

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.devices import get_device
from mebp_core.plan.grid import candidate_knobs
from mebp_core.plan.on_host import fastest_fitting, plan_on_host
from mebp_core.plan.planner import make_plan
from mebp_core.plan.predict import COMPONENTS
from mebp_core.plan.workload import Workload
from mebp_core.units import MB


@pytest.mark.parametrize("bf16_matmul", ["float32", "native"])
def test_the_planner_keeps_the_runs_bf16_matmul_path(bf16_matmul, seed_calibration,
                                                    tmp_path):
    """The path is the host's choice, not a trade-off: every candidate takes it, and so do
    the knobs ``--plan-budget-mb`` picks, with the run's own thread count; with float32
    matmuls no block is held whole."""
    arch = load_architecture("preset:qwen2.5-0.5b")
    config = TrainConfig(seq_len=256, compute_dtype="bfloat16",
                         knobs=EngineKnobs(bf16_matmul=bf16_matmul, threads=2))
    cache = seed_calibration(tmp_path, threads=2)
    plan = plan_on_host(arch, config, budget_bytes=64 << 30, cache_dir=cache, measure=False)
    assert {entry.knobs.bf16_matmul for entry in plan.entries} == {bf16_matmul}
    knobs = fastest_fitting(plan, config).knobs
    assert knobs.bf16_matmul == bf16_matmul and knobs.threads == 2
    assert knobs == plan.auto.knobs.model_copy(update={"threads": 2})


def test_the_front_is_exactly_the_non_dominated_set(workload, host):
    """Non-dominated as the plan shows the figures: the peak to 0.1 MB, the time to 0.1 ms."""
    plan = make_plan(workload, host)
    points = [(round(e.prediction.peak_bytes / MB, 1), e.shown_time_s, e) for e in plan.entries]
    for peak, seconds, entry in points:
        dominated = any(p <= peak and s <= seconds and (p, s) != (peak, seconds)
                        for p, s, _ in points)
        assert entry.pareto == (not dominated), entry.id
    front = plan.pareto
    assert len(front) >= 3
    assert front[0].prediction.step_time_s > front[-1].prediction.step_time_s


def test_auto_is_the_fastest_feasible_configuration(workload, host):
    plan = make_plan(workload, host, budget_bytes=600 * MB)
    feasible = [e for e in plan.entries if e.feasible]
    assert feasible and any(e.feasible is False for e in plan.entries)
    assert plan.auto in feasible
    assert plan.auto.prediction.step_time_s == min(e.prediction.step_time_s for e in feasible)
    for entry in plan.entries:
        assert entry.feasible == (entry.prediction.peak_bytes * 1.1 <= 600 * MB)
        assert (entry.reason is None) == entry.feasible


def test_the_recommendation_is_the_smallest_within_the_tolerance_of_the_fastest(workload,
                                                                              host):
    """On the reference phone (1024 MB) the fastest configuration without a graph tail
    holds about 392 MB for 3.88 s/step (those keeping weights resident, 842 MB and up, read
    the store they leave out again every sweep under that budget); one of about 371 MB takes
    3.91: within 3%, it is recommended."""
    phone = get_device("iphone-15-pro-max")
    every = make_plan(workload, host, device=phone, knobs=[
        k for k in candidate_knobs(workload, host.threads) if not k.graph_tail_blocks])
    fastest, close = every.auto, every.recommended()
    plan = make_plan(workload, host, device=phone,
                     knobs=[fastest.knobs, close.knobs, every.smallest.knobs])
    assert plan.auto.id == fastest.id and plan.recommended().id == close.id != fastest.id
    assert close.prediction.peak_bytes < fastest.prediction.peak_bytes
    assert fastest.ranking_time_s < close.ranking_time_s <= 1.03 * fastest.ranking_time_s
    assert every.smallest.ranking_time_s > 1.03 * fastest.ranking_time_s
    assert plan.recommended(0).id == fastest.id  # no tolerance: the fastest
    assert plan.recommended(10).id == every.smallest.id  # any time: the smallest
    # over the whole grid: nothing that fits is smaller and as close
    near = [e for e in every.entries
            if e.feasible and e.ranking_time_s <= 1.03 * fastest.ranking_time_s]
    assert close.prediction.peak_bytes == min(e.prediction.peak_bytes for e in near)
    why = plan.recommendation()["why"]
    assert why.startswith("smallest within 3% of the fastest that fits (3.88 s/step at 392 MB)")
    assert f"{close.prediction.peak_bytes / MB:.0f} MB, fits 1024 MB" in why


def test_an_infeasible_budget_gives_the_smallest_budget_that_fits(workload, host):
    plan = make_plan(workload, host, budget_bytes=100 * MB)
    assert plan.auto is None
    summary = plan.to_json()
    assert summary["feasible"] is False
    assert summary["dominant_component"] in COMPONENTS
    smallest = plan.smallest_budget_bytes()
    assert make_plan(workload, host, budget_bytes=smallest).auto is not None
    assert make_plan(workload, host, budget_bytes=smallest - 2 * MB).auto is None
    reasons = [e.reason for e in plan.entries]
    assert all("budget 100 MB" in r for r in reasons)


def test_the_grid_covers_every_knob(workload, host):
    # token chunks only where a block cannot run its MLP by columns (Gemma 3's norms)
    gemma = Workload(arch=load_architecture("preset:gemma3-1b"), seq_len=256)
    grid = candidate_knobs(workload) + candidate_knobs(gemma)
    for field in ("frozen_weights", "checkpoint_blocks", "checkpoint_storage", "lora_hidden",
                  "share_decompression", "decompress_tile_bytes", "loss_vocab_tile_bytes",
                  "mlp_chunk_tokens", "mlp_intermediate_chunk", "graph_tail_blocks"):
        assert len({getattr(k, field) for k in grid}) >= 2, field
    assert any(k.resident_weight_bytes for k in grid)


@pytest.mark.parametrize(("model", "seq_len"), [("qwen2.5-0.5b", 64), ("smollm2-135m", 32)])
def test_a_device_without_rates_plans_as_no_device_does(model, seq_len, host):
    """A custom budget has no phone estimate: its plan ranks by this host's times, shown to
    0.1 ms, and its front and auto are judged on those, as without a device."""
    workload = Workload(arch=load_architecture(f"preset:{model}"), seq_len=seq_len)
    custom = make_plan(workload, host, budget_bytes=600 * MB, device=get_device("custom"))
    plain = make_plan(workload, host, budget_bytes=600 * MB)
    assert [e.id for e in custom.pareto] == [e.id for e in plain.pareto]
    assert custom.auto.id == plain.auto.id


def test_auto_is_on_the_front_it_is_shown_with(workload, host):
    """auto is the fastest as shown (the smallest among equals), so it is never a larger
    configuration faster by less than the plan shows, off the front."""
    for device in (None, get_device("iphone-15-pro-max"), get_device("iphone-13")):
        plan = make_plan(workload, host, budget_bytes=1024 * MB, device=device)
        assert plan.auto.pareto, (device, plan.auto.id)
