"""Past the no-checkpoint step only resident weights are left to buy, and the grid keeps the
first k blocks resident for every k: the front has no hole there wider than a block's
weights, and every 100 MB of budget up to every block resident buys a faster configuration
(1-2.4% at the tests' calibration: a block's two decompressions a step for its 28 MB in bf16).
With resident budgets in quarters of the weights only, the holes were a quarter wide (235 MB
for qwen2.5-0.5b in bf16) and 100 MB bought 0-0.3% in some of them. The head goes last (a
block byte saves two decompressions a step, a head byte one), whole: its 272 MB remain the
front's one hole before everything is resident."""

from __future__ import annotations

import functools
import itertools

import pytest

from mebp_core.plan.arch import load_architecture
from mebp_core.plan.grid import candidate_knobs, resident_block_counts
from mebp_core.plan.planner import make_plan
from mebp_core.plan.weight_memory import resident_weights
from mebp_core.plan.workload import DTYPE_BYTES, Workload
from mebp_core.units import MB


def resident_blocks(knobs, workload: Workload) -> int:
    """How many blocks' weights a configuration keeps resident, whole."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    return resident_weights(arch, knobs, e).bytes // (arch.block_params() * e)


def test_a_deeper_models_counts_are_spaced_and_end_at_every_block():
    assert resident_block_counts(24) == list(range(1, 25))
    assert resident_block_counts(30) == [*range(1, 30, 2), 30]
    arch = load_architecture("preset:smollm2-135m")  # 30 blocks; its 3/4 keeps 28
    workload = Workload(arch=arch, seq_len=256, compute_dtype="bfloat16")
    kept = {resident_blocks(k, workload) for k in candidate_knobs(workload)
            if k.checkpoint_blocks == "none"}
    assert {*range(1, 30, 2), 30} <= kept


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_front_past_the_no_checkpoint_step_moves_a_block_at_a_time(host, dtype):
    arch = load_architecture("preset:qwen2.5-0.5b")
    workload = Workload(arch=arch, seq_len=256, compute_dtype=dtype)
    block = arch.block_params() * DTYPE_BYTES[dtype]
    plan = make_plan(workload, host, bf16_matmul="native" if dtype == "bfloat16" else "auto")
    front = [e for e in plan.pareto if e.knobs.checkpoint_blocks == "none"
             and resident_blocks(e.knobs, workload) <= arch.num_layers
             and e.prediction.peak_bytes < plan.pareto[-1].prediction.peak_bytes]
    assert {resident_blocks(e.knobs, workload) for e in front} >= set(range(arch.num_layers + 1))
    peaks = [e.prediction.peak_bytes for e in front]
    assert max(b - a for a, b in itertools.pairwise(peaks)) <= 1.1 * block


def test_every_100_mb_past_the_no_checkpoint_step_buys_a_faster_step(host):
    arch = load_architecture("preset:qwen2.5-0.5b")
    workload = Workload(arch=arch, seq_len=256, compute_dtype="bfloat16")

    @functools.cache  # each budget is both a "now" and a "before"
    def fastest(budget_mb: int):
        return make_plan(workload, host, budget_bytes=budget_mb * MB,
                         bf16_matmul="native").auto

    every_block = next(e for e in make_plan(workload, host, bf16_matmul="native").pareto
                       if resident_blocks(e.knobs, workload) == arch.num_layers)
    first = next(b for b in range(500, 1000, 10)
                 if fastest(b).knobs.checkpoint_blocks == "none")
    last = int(every_block.prediction.peak_bytes * 1.1 / MB) + 1
    assert last - first > 600  # the span checked: 24 blocks of 28 MB and the margin
    for budget_mb in range(first + 100, last + 1, 20):
        before, now = fastest(budget_mb - 100), fastest(budget_mb)
        assert now.ranking_time_s < 0.995 * before.ranking_time_s, (budget_mb, now.id,
                                                                     before.id)
