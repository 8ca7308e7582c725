"""What the planner predicts and picks for graph tails (the last blocks kept whole, without
recompute): memory and time a block at a time, tiles only in a tail's backward, a front with
no gap between the checkpointed and the no-checkpoint step, and a tail on phones whose budget
falls between them. (That a tail holds what is predicted: test_graph_tail_memory.py.)"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.devices import get_device, paper_workload
from mebp_core.plan.grid import candidate_knobs
from mebp_core.plan.planner import make_plan
from mebp_core.plan.predict import predict
from mebp_core.plan.workload import DTYPE_BYTES, Workload
from mebp_core.units import MB


def test_a_graph_tail_trades_a_blocks_activations_for_its_recompute(host):
    """Each block of the tail keeps its activations (about 13 MB here in native bf16, 21 MB
    upcast: the no-checkpoint step's per block; its MLP keeps gate and up alone) and saves
    its recompute: memory and time move a block at a time, from the checkpointed step to the
    no-checkpoint one, on the host and on a phone."""
    arch = load_architecture("preset:qwen2.5-0.5b")
    workload = Workload(arch=arch, seq_len=256, compute_dtype="bfloat16")
    phone = get_device("iphone-15-pro-max")

    def figures(bf16_matmul="native", **knobs):
        prediction = predict(workload, EngineKnobs(lora_hidden="store", bf16_matmul=bf16_matmul,
                                                   **knobs), host)
        device = phone.estimate_step_time(prediction, workload, None)
        return prediction, device

    tails = [figures(graph_tail_blocks=k) for k in range(arch.num_layers + 1)]
    checkpointed, graph = figures(), figures(checkpoint_blocks="none")
    assert tails[0] == checkpointed
    # the whole model in the tail is the no-checkpoint step, figure for figure
    assert tails[-1][0].memory == graph[0].memory and tails[-1][1] == graph[1]
    assert tails[-1][0].time == pytest.approx(graph[0].time)
    per_block = (graph[0].peak_bytes - checkpointed[0].peak_bytes) / arch.num_layers
    assert 10 * MB < per_block < 14 * MB
    upcast = figures("float32", checkpoint_blocks="none")[0].peak_bytes - \
        figures("float32")[0].peak_bytes
    assert 17 * MB < upcast / arch.num_layers < 23 * MB  # float32's heap retention
    for k in range(2, arch.num_layers + 1):
        (shorter, shorter_device), (longer, longer_device) = tails[k - 1], tails[k]
        assert 0 < longer.peak_bytes - shorter.peak_bytes < 1.25 * per_block, k
        assert longer.step_time_s < shorter.step_time_s and longer_device < shorter_device, k
        assert longer.memory["checkpoints"] < shorter.memory["checkpoints"]
    # one block's recompute each: the tail's time is the checkpointed step's less the
    # no-checkpoint step's saving, in equal parts
    saving = checkpointed[0].step_time_s - graph[0].step_time_s
    for k in (1, 6, 12, 23):
        assert checkpointed[0].step_time_s - tails[k][0].step_time_s == \
            pytest.approx(saving * k / arch.num_layers, rel=0.05)
        assert tails[k][0].time["decompress"] == pytest.approx(
            checkpointed[0].time["decompress"], rel=0.02)  # two a block either way, shared


@pytest.mark.parametrize(("dtype", "bf16_matmul"), [("float32", "auto"),
                                                    ("bfloat16", "native")])
def test_a_tails_blocks_are_never_decompressed_whole(host, dtype, bf16_matmul):
    """A tail's backward decompresses in tiles: when resident weights (a budget's first
    blocks) cover every checkpointed block, no block is decompressed whole and the backward
    holds no block of weights. The weights held are checked in float32, where a block's
    (57 MB) make the checkpointed backward the peak phase (in native bf16 the tail's is)."""
    arch = load_architecture("preset:qwen2.5-0.5b")
    workload = Workload(arch=arch, seq_len=256, compute_dtype=dtype)
    block = DTYPE_BYTES[dtype] * arch.block_params()

    def with_resident(blocks: int):
        return predict(workload, EngineKnobs(frozen_weights="resident", graph_tail_blocks=1,
                                             resident_weight_bytes=blocks * block,
                                             bf16_matmul=bf16_matmul), host)

    covered, short = with_resident(arch.num_layers - 1), with_resident(arch.num_layers - 2)
    assert covered.device_work.whole_params == 0
    assert short.device_work.whole_params == arch.block_params()  # block 22's, once
    if dtype != "float32":
        return
    arena = short.memory["weights"] - (arch.num_layers - 2) * block
    assert arena >= block  # block 22's weights, whole, in its backward
    # the covered one holds a tile (8 MB) beside its resident blocks, never a block
    assert covered.memory["weights"] - (arch.num_layers - 1) * block <= 8 * MB < block


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_graph_tails_fill_the_front_between_300_mb_and_1_gb(host, allocator):
    """qwen2.5-0.5b at seq 256 in bfloat16: without tails the picks jumped from the
    checkpointed step (292 MB) to the no-checkpoint one (843 MB) with nothing in between.
    Now every 100 MB of budget from 300 MB up to the no-checkpoint step buys a configuration
    at least 5% faster (the last step to it buys what is left of the tail, a block or two).

    100 MB of budget holds 100 / 1.1 / 11.8 = 7.7 more blocks' activations (native bf16: a
    chained block's MLP keeps gate and up alone, counted at 1.25x its saved tensors; under
    jemalloc at 0.85x, 11 blocks, and the no-checkpoint step comes at 530 MB, not 640), and each
    saves its recompute, which no longer multiplies the down projection (29% of a block's
    products): 5.4-6.6% of the step here past the first tails (4.7% at 1.5x, 3.3-4.8% when
    the MLPs kept four tensors). Past the no-checkpoint step only resident weights are left
    to buy, and they buy little per byte (two decompressions of a 30 MB block, ~10 ms,
    against a block's recompute, ~40 ms): 1-2.4% a 100 MB there
    (``test_resident_blocks_plans.py``)."""
    arch = load_architecture("preset:qwen2.5-0.5b")
    workload = Workload(arch=arch, seq_len=256, compute_dtype="bfloat16")
    host = dataclasses.replace(host, allocator=allocator)

    def fastest(budget_mb: int):
        return make_plan(workload, host, budget_bytes=budget_mb * MB, bf16_matmul="native").auto

    steps, whole_step_mb = 0, None
    for budget_mb in range(300, 1001, 10):
        before, now = fastest(budget_mb - 100), fastest(budget_mb)
        if now.knobs.checkpoint_blocks == "none":
            whole_step_mb = whole_step_mb or budget_mb
        if before is None:
            continue  # nothing fits 100 MB less
        if "none" in (before.knobs.checkpoint_blocks, now.knobs.checkpoint_blocks):
            continue  # the front's end: less than 100 MB of tail was left to buy
        steps += 1
        assert now.ranking_time_s <= 0.95 * before.ranking_time_s, (budget_mb, now.id,
                                                                     before.id)
    # checked at every budget from 400 MB (where 100 MB less always fits) to the step
    assert whole_step_mb is not None and steps >= (whole_step_mb - 400) // 10
    # the front has no gap wider than a block's activations between the two steps
    pareto = make_plan(workload, host, bf16_matmul="native").pareto
    whole_step = min(e.prediction.peak_bytes for e in pareto
                     if e.knobs.checkpoint_blocks == "none")
    front = [e for e in pareto if 290 * MB < e.prediction.peak_bytes <= whole_step]
    peaks = [e.prediction.peak_bytes for e in front]
    assert max(b - a for a, b in itertools.pairwise(peaks)) < 15 * MB
    # every tail from the shortest on the front (under jemalloc a tail of 1 or 2 pays the
    # chain's onset for less than resident blocks buy there)
    tails = {e.knobs.graph_tail_blocks for e in front} - {0}
    assert min(tails) <= 3 and tails >= set(range(min(tails), arch.num_layers))


@pytest.mark.parametrize("device", ["iphone-13", "iphone-se-3", "android-4gb"])
def test_a_phone_between_the_two_steps_runs_a_graph_tail_and_is_estimated_faster(device,
                                                                                  host):
    """The paper's setting on phones of 512 MB: their budgets fall between the checkpointed
    step and the no-checkpoint one (578 MB, 636 with the margin; a 768 MB phone runs that),
    so a tail is the fastest that fits, and the phone's estimate (no recompute for the tail:
    fewer FLOPs and dispatches, the same decompressions) beats the best without one."""
    paper = paper_workload("preset:qwen2.5-0.5b", 256)
    phone = get_device(device)
    grid = candidate_knobs(paper, host.threads, "native")
    with_tails = make_plan(paper, host, device=phone, bf16_matmul="native")
    without = make_plan(paper, host, device=phone, bf16_matmul="native",
                        knobs=[k for k in grid if not k.graph_tail_blocks])
    assert with_tails.auto.knobs.graph_tail_blocks > 0
    assert with_tails.auto.ranking_time_s < 0.96 * without.auto.ranking_time_s
    work = with_tails.auto.prediction.device_work
    checkpointed = next(e for e in with_tails.entries if e.knobs == with_tails.auto.knobs
                        .model_copy(update={"graph_tail_blocks": 0}))
    # the same configuration without its tail is estimated slower on the phone
    assert with_tails.auto.device_step_time_s < 0.97 * checkpointed.device_step_time_s
    assert work.matmul_flops < checkpointed.prediction.device_work.matmul_flops
    assert work.ops < checkpointed.prediction.device_work.ops
    assert work.tile_params + work.whole_params == pytest.approx(
        checkpointed.prediction.device_work.tile_params +
        checkpointed.prediction.device_work.whole_params)


def test_a_768_mb_phone_runs_the_no_checkpoint_step(host):
    """The paper's setting fits whole in 768 MB now that a chained block's MLP keeps gate and
    up alone (578 MB predicted, 605 at the chain's earlier count; 742 when it kept four
    tensors, which left this phone a tail)."""
    paper = paper_workload("preset:qwen2.5-0.5b", 256)
    plan = make_plan(paper, host, device=get_device("iphone-15"), bf16_matmul="native")
    assert plan.auto.knobs.checkpoint_blocks == "none"
    assert plan.auto.prediction.peak_bytes < 768 * MB / 1.1
