"""What the planner predicts of one configuration on a fixed host: each memory component from
the architecture, each knob's effect on memory and time, the bf16 matmul paths, MeZO's
vocabulary passes, the matmul and decompression rates a figure is priced at, and the store
reads a tight budget adds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import DECOMPRESS_SIZES
from mebp_core.plan.devices import paper_knobs
from mebp_core.plan.planner import make_plan
from mebp_core.plan.predict import COMPONENTS, NATIVE_BF16_BYTES, native_bf16_bytes, predict
from mebp_core.plan.store_reads import (
    MAPPED_REREAD_FAULT_BYTES_PER_S,
    READ_AHEAD_COST,
    RUNTIME_FILE_BYTES,
    mapped_reread_bytes,
    staging_bytes,
)
from mebp_core.plan.timing import step_work
from mebp_core.plan.workload import Workload, packed_bytes_per_param
from mebp_core.resident import select_resident
from mebp_core.units import MB


def test_component_sizes_follow_from_the_architecture(workload, host):
    prediction = predict(workload, EngineKnobs(), host)
    assert set(prediction.memory) == set(COMPONENTS)
    d, layers = 896, 24  # qwen2.5-0.5b
    assert prediction.memory["checkpoints"] == layers * 256 * d * 4  # one (T, D) per block
    # r=8 float32 A and B on q (896x896), k, v (128x896), o (896x896), gate, up (4864x896),
    # down (896x4864), in every block; fused SGD: one block's gradients at a time
    per_block = 8 * 4 * ((896 + 896) * 2 + (896 + 128) * 2 + (896 + 4864) * 3)
    assert prediction.memory["lora"] == layers * per_block + per_block
    # one block's projections decompressed whole for its backward, float32
    block_weights = 4 * (896 * 896 * 2 + 128 * 896 * 2 + 4864 * 896 * 3)
    assert prediction.memory["weights"] == block_weights
    assert prediction.memory["runtime"] > host.runtime_bytes


def test_bfloat16_with_float32_matmuls_stores_in_bf16_and_computes_at_float32_rates(host):
    """The host fixture's bf16 matmuls run at twice float32's rate: the float32 path must be
    predicted at float32's matmul time, with bf16 storage plus upcast tiles in memory."""
    arch = load_architecture("preset:qwen2.5-0.5b")
    fp32 = predict(Workload(arch=arch, seq_len=256), EngineKnobs(), host)
    bf16 = Workload(arch=arch, seq_len=256, compute_dtype="bfloat16")
    upcast = predict(bf16, EngineKnobs(bf16_matmul="float32", share_decompression=True), host)
    native = predict(bf16, EngineKnobs(bf16_matmul="native"), host)
    assert upcast.time["matmul"] == pytest.approx(fp32.time["matmul"])
    assert native.time["matmul"] < 0.6 * upcast.time["matmul"]
    assert upcast.time["elementwise"] > native.time["elementwise"]  # the upcasts
    assert upcast.memory["checkpoints"] == native.memory["checkpoints"] \
        == fp32.memory["checkpoints"] / 2
    block_bf16 = 2 * (896 * 896 * 2 + 128 * 896 * 2 + 4864 * 896 * 3)
    assert native.memory["weights"] == block_bf16
    upcast_tile = (8 * MB // (896 * 4)) * 896 * 4  # the widest rows in 8 MB, float32
    assert upcast.memory["weights"] == block_bf16 + upcast_tile
    # what the run holds beside the runtime: bf16 storage either way, the upcasts on top
    held = {name: p.peak_bytes - p.memory["runtime"] for name, p in
            (("native", native), ("upcast", upcast), ("fp32", fp32))}
    assert held["native"] < held["upcast"] < held["fp32"]
    # native bf16 matmuls keep memory of their own (measured: BENCHMARKS.md)
    assert native.memory["runtime"] == upcast.memory["runtime"] + NATIVE_BF16_BYTES
    # by default an upcasting run holds no block: its tiles go straight to float32
    auto = predict(bf16, EngineKnobs(bf16_matmul="float32"), host)
    assert auto.memory["weights"] == upcast_tile
    assert auto.time["decompress"] > upcast.time["decompress"]
    assert auto.time["elementwise"] < upcast.time["elementwise"]


@pytest.mark.parametrize(("seq_len", "batch_size", "kept_mb"),
                         [(128, 1, 19), (256, 1, 19), (512, 2, 40.75), (1024, 1, 40.75),
                          (2048, 1, 69.75)])
def test_native_bf16_matmuls_keep_more_past_256_tokens(host, seq_len, batch_size, kept_mb):
    """oneDNN's cached primitives, measured at 17-18 MB up to 512 tokens and 30-58 MB at
    1024-2048 on an AMX Xeon: counted flat to 256 tokens (a step's, every sequence of the
    batch), then by a bound per token over them."""
    arch = load_architecture("preset:qwen2.5-0.5b")
    workload = Workload(arch=arch, seq_len=seq_len, batch_size=batch_size,
                        compute_dtype="bfloat16")
    native = predict(workload, EngineKnobs(bf16_matmul="native"), host)
    upcast = predict(workload, EngineKnobs(bf16_matmul="float32"), host)
    kept = native.memory["runtime"] - upcast.memory["runtime"]
    assert kept == native_bf16_bytes(workload, host.allocator)
    assert kept / MB == pytest.approx(kept_mb, abs=0.5)


def test_each_knob_moves_memory_and_time_the_way_it_should(workload, host):
    base = predict(workload, EngineKnobs(), host)
    resident = predict(workload, EngineKnobs(frozen_weights="resident"), host)
    assert resident.memory["weights"] > base.memory["weights"] + 1000 * MB  # ~1.9 GB float32
    assert resident.time["decompress"] == 0 < base.time["decompress"]

    whole_graph = predict(workload, EngineKnobs(checkpoint_blocks="none"), host)
    assert whole_graph.memory["checkpoints"] == 0
    assert whole_graph.memory["activations"] > 5 * base.memory["activations"]
    assert whole_graph.step_time_s < base.step_time_s  # no recompute

    sparse = predict(workload, EngineKnobs(checkpoint_blocks=4), host)
    assert sparse.memory["checkpoints"] == pytest.approx(base.memory["checkpoints"] / 4)
    assert sparse.step_time_s > base.step_time_s  # segments are re-run

    on_disk = predict(workload, EngineKnobs(checkpoint_storage="mmap"), host)
    assert on_disk.memory["checkpoints"] < base.memory["checkpoints"]

    stored = predict(workload, EngineKnobs(lora_hidden="store"), host)
    assert stored.memory["activations"] > base.memory["activations"]

    unshared = predict(workload, EngineKnobs(share_decompression=False), host)
    assert unshared.memory["weights"] < base.memory["weights"]
    assert unshared.time["decompress"] > base.time["decompress"]

    adamw = predict(Workload(arch=workload.arch, seq_len=256, optimizer="adamw"),
                    EngineKnobs(), host)
    assert adamw.memory["lora"] > base.memory["lora"]


def test_a_resident_budget_is_respected_and_matches_the_engine_rule(workload, host):
    budget = 300 * MB
    prediction = predict(workload, EngineKnobs(frozen_weights="resident",
                                               resident_weight_bytes=budget), host)
    lazy = predict(workload, EngineKnobs(), host)
    assert 0 < prediction.memory["weights"] - lazy.memory["weights"] <= budget
    chosen = select_resident([("model.layers.1.mlp.up_proj.weight", 10),
                              ("lm_head.weight", 5),
                              ("model.layers.0.mlp.up_proj.weight", 10)], 15)
    assert chosen == ["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]


def test_mezo_pays_the_vocabulary_pass_of_each_of_its_two_forwards():
    """MeBP's loss and its gradient come from one pass over the vocabulary; each of MeZO's
    two forwards makes a loss of its own, so a larger vocabulary adds twice the traffic."""
    arch = load_architecture("preset:qwen2.5-0.5b")
    knobs = paper_knobs()

    def added_traffic(method: str) -> float:
        small, large = (step_work(Workload(arch=replace(arch, vocab_size=vocab), seq_len=256,
                                           method=method), knobs, set()).traffic_bytes
                        for vocab in (50_000, 150_000))
        return large - small

    assert added_traffic("mezo") == pytest.approx(2 * added_traffic("mebp"), rel=1e-9)
    assert added_traffic("mebp") > 0


def test_matmul_rates_interpolate_between_measured_shapes(host):
    assert host.matmul_rate("float32", 2048, 4096) == pytest.approx(1.2e11)
    assert host.matmul_rate("float32", 2048, 1024) == pytest.approx((8e10 + 1.2e11) / 2)
    assert host.matmul_rate("float32", 32, 4096) == pytest.approx(5e10 / 2)  # overhead-bound
    assert host.matmul_rate("float32", 1 << 20, 1 << 20) == pytest.approx(1.2e11)  # flat
    assert host.matmul_rate("bfloat16", 2048, 4096, "nn") == pytest.approx(2.4e11)


def test_decompression_is_priced_at_the_rate_for_its_output_size(workload, host):
    """Small tiles and whole shared blocks decompress slower than a projection-sized tile on
    most hosts: each kind of decompression takes the rate measured nearest its size."""
    small, projection, block = DECOMPRESS_SIZES
    rates = {str(small): 1e9, str(projection): 3e9, str(block): 1.5e9}
    sized = replace(host, decompress_params_per_s={
        q: {d: rates for d in by_dtype} for q, by_dtype in host.decompress_params_per_s.items()})
    assert sized.decompress_rate("int4", "float32", projection) == 3e9
    assert sized.decompress_rate("int4", "float32", small / 4) == 1e9  # flat beyond
    assert sized.decompress_rate("int4", "float32", 4 * block) == 1.5e9
    assert 1.5e9 < sized.decompress_rate("int4", "float32", 2 * projection) < 3e9
    for knobs in (EngineKnobs(share_decompression=True, checkpoint_blocks=1),
                  EngineKnobs(share_decompression=False, checkpoint_blocks=1,
                              decompress_tile_bytes=1 << 20)):
        work = step_work(workload, knobs, set())
        tile_size = work.tile_params / work.tile_calls
        block = workload.arch.block_params()
        expected = (work.tile_params / sized.decompress_rate("int4", "float32", tile_size) +
                    work.whole_params / sized.decompress_rate("int4", "float32", block))
        flat = (work.tile_params + work.whole_params) / 3e9
        before = predict(workload, knobs, host).modelled_time["decompress"]
        after = predict(workload, knobs, sized).modelled_time["decompress"]
        assert after - before == pytest.approx(expected - flat)
        assert after > before


def test_a_tight_budget_adds_the_store_reads_that_no_longer_stay_cached(workload, host):
    lazy_id = "lazy-ckpt1-ram-h-recompute-shared-tile8M"
    roomy = {e.id: e for e in make_plan(workload, host, budget_bytes=8000 * MB).entries}
    tight = {e.id: e for e in make_plan(workload, host, budget_bytes=450 * MB).entries}
    assert roomy[lazy_id].prediction.time["disk"] == 0
    lazy = tight[lazy_id].prediction
    store, arch = lazy.store_bytes, workload.arch
    assert 200 * MB < store < 400 * MB  # qwen2.5-0.5b at int4 g64
    # the step reads the blocks in its forward and again in its backward, the head once
    head = arch.head_params() * packed_bytes_per_param(workload)
    assert lazy.store_read_bytes == pytest.approx(2 * (store - head) + head, rel=1e-6)
    # the runtime's own file pages first; each sweep reads the share that did not fit
    # again, at the price of a fault and of room made under the cap
    room = 450 * MB - lazy.peak_bytes - RUNTIME_FILE_BYTES
    assert 0 < room < store
    # read from the disk and faulted in
    assert lazy.time["disk"] == pytest.approx(
        lazy.store_read_bytes * (store - room) / store
        * (1 / host.disk_read_bytes_per_s + 1 / MAPPED_REREAD_FAULT_BYTES_PER_S))
    resident = tight["resident-nockpt-h-recompute-shared-tile8M"].prediction
    assert resident.store_bytes == 0 and resident.time["disk"] == 0
    assert "resident-nockpt-h-recompute-shared-tile8M-direct" not in tight  # reads nothing


def test_a_mapped_stores_rereads_cost_the_disks_time_and_the_faults():
    """Priced as bytes at the disk's rate: each byte read again costs its read and its
    fault, whatever the disk; only the share of the store that does not fit is read again."""
    store, reads = 300 * MB, 500 * MB
    for disk in (0.3e9, MAPPED_REREAD_FAULT_BYTES_PER_S, 3e9):
        seconds = mapped_reread_bytes(store, reads, 0, disk) / disk
        assert seconds == pytest.approx(reads / disk + reads / MAPPED_REREAD_FAULT_BYTES_PER_S)
    disk = MAPPED_REREAD_FAULT_BYTES_PER_S
    assert mapped_reread_bytes(store, reads, store // 3, disk) == pytest.approx(4 / 3 * reads)
    assert mapped_reread_bytes(store, reads, -store, disk) == pytest.approx(2 * reads)
    assert mapped_reread_bytes(store, reads, store, disk) == 0
    assert mapped_reread_bytes(0, reads, 0, disk) == 0


def test_direct_reads_trade_the_page_cache_for_two_staging_buffers(workload, host):
    """Direct: no store pages to keep (a cap adds no reads), two block-sized buffers
    counted, and every sweep's reads priced: in line in full, read ahead in part."""
    mapped_id = "lazy-ckpt1-ram-h-recompute-shared-tile8M"
    block = workload.arch.block_params() * packed_bytes_per_param(workload)
    assert 2 * block <= staging_bytes(workload) <= 2 * block + 32 * 4096
    times = {}
    for budget_mb in (8000, 400):
        plan = {e.id: e for e in make_plan(workload, host,
                                           budget_bytes=budget_mb * MB).entries}
        mapped, direct = plan[mapped_id].prediction, plan[f"{mapped_id}-direct"].prediction
        assert direct.store_bytes == 0 and direct.store_read_bytes == 0
        assert direct.peak_bytes - mapped.peak_bytes == staging_bytes(workload)
        reads = mapped.store_read_bytes
        assert READ_AHEAD_COST * reads < direct.direct_read_cost_bytes < 0.5 * reads
        assert direct.time["disk"] == pytest.approx(
            direct.direct_read_cost_bytes / host.disk_read_bytes_per_s)
        assert {k: v for k, v in direct.time.items() if k != "disk"} == \
            {k: v for k, v in mapped.time.items() if k != "disk"}
        times[budget_mb] = mapped.step_time_s, direct.step_time_s
    # uncapped the cached store is cheaper; at 400 MB it does not fit beside the step
    assert times[8000][0] < times[8000][1]
    assert times[400][1] < times[400][0]


def test_no_direct_twin_where_checkpoints_skip_blocks(workload, host):
    """A segment's blocks re-run forward, then back: the reader's guess misses at every
    turn, which the planner does not price, so it offers no such configuration."""
    ids = {e.id for e in make_plan(workload, host).entries}
    assert "lazy-ckpt1-ram-h-recompute-shared-tile8M-direct" in ids
    assert "lazy-nockpt-h-recompute-shared-tile8M-direct" in ids
    assert not [i for i in ids if i.endswith("-direct") and ("ckpt2" in i or "ckpt4" in i)]
