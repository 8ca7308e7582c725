"""The planner counts a graph's heap holes for the allocator the host's engines run under
(``HostCalibration.allocator``): glibc's keep a chained block's freed temporaries, jemalloc's
reuse them. What the kernel counts under each is held by ``test_graph_tail_memory.py``."""

from __future__ import annotations

import dataclasses

import pytest

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.planner import make_plan
from mebp_core.plan.predict import predict
from mebp_core.plan.workload import Workload
from mebp_core.units import MB

WHOLE_GRAPH = EngineKnobs(checkpoint_blocks="none")
TAIL = EngineKnobs(graph_tail_blocks=8)
SMALLEST = EngineKnobs(checkpoint_storage="mmap", share_decompression=False,
                       mlp_intermediate_chunk=1216, decompress_tile_bytes=1 << 20)


@pytest.fixture(scope="module")
def qwen():
    return load_architecture("preset:qwen2.5-0.5b")


def activations_mb(arch, host, knobs: EngineKnobs, allocator: str, dtype="float32") -> float:
    workload = Workload(arch=arch, seq_len=256, compute_dtype=dtype)
    prediction = predict(workload, knobs, dataclasses.replace(host, allocator=allocator))
    return prediction.memory["activations"] / MB


@pytest.mark.parametrize("knobs", [WHOLE_GRAPH, TAIL], ids=["whole graph", "tail of 8"])
def test_a_chain_under_jemalloc_is_counted_without_glibcs_holes(qwen, host, knobs):
    glibc = activations_mb(qwen, host, knobs, "glibc")
    jemalloc = activations_mb(qwen, host, knobs, "jemalloc")
    # 2.25x a block's saved tensors and 1.25 blocks of onset, against 1.0x and none
    assert jemalloc < 0.5 * glibc


def test_a_block_recomputed_alone_is_counted_at_its_allocators_retention(qwen, host):
    glibc = activations_mb(qwen, host, SMALLEST, "glibc")
    jemalloc = activations_mb(qwen, host, SMALLEST, "jemalloc")
    # 1.25x its saved tensors against 1.75x, its backward temporaries at 0.6x of glibc's
    # count; the running sums beside them alike
    assert 0.6 * glibc < jemalloc < 0.75 * glibc


def test_native_bf16_is_counted_lower_under_jemalloc(qwen, host):
    def native_mb(knobs: EngineKnobs, allocator: str) -> float:
        return activations_mb(qwen, host, knobs.model_copy(update={"bf16_matmul": "native"}),
                              allocator, "bfloat16")

    # a chained block at 0.85x its saved tensors against 1.25x, both above 4 blocks of onset
    whole = native_mb(WHOLE_GRAPH, "jemalloc") / native_mb(WHOLE_GRAPH, "glibc")
    assert 0.6 < whole < 0.75
    # a block recomputed alone: its saved tensors alike, its backward temporaries at 0.6x
    alone = native_mb(SMALLEST, "jemalloc") / native_mb(SMALLEST, "glibc")
    assert 0.7 < alone < 0.9


def test_native_bf16s_own_bytes_grow_past_256_tokens_only_under_glibc(qwen, host):
    """oneDNN's cached primitives: glibc's count grew with the tokens, jemalloc's did not."""
    def runtime_mb(allocator: str, seq_len: int) -> float:
        workload = Workload(arch=qwen, seq_len=seq_len, compute_dtype="bfloat16")
        prediction = predict(workload, EngineKnobs(bf16_matmul="native"),
                             dataclasses.replace(host, allocator=allocator))
        return prediction.memory["runtime"] / MB

    assert runtime_mb("jemalloc", 2048) == runtime_mb("jemalloc", 256)
    assert runtime_mb("glibc", 2048) > runtime_mb("glibc", 256) + 40


def test_under_jemalloc_the_no_checkpoint_step_fits_a_smaller_budget(qwen, host):
    workload = Workload(arch=qwen, seq_len=256, compute_dtype="float32")

    def least_budget_without_checkpoints(allocator: str) -> float:
        plan = make_plan(workload, dataclasses.replace(host, allocator=allocator))
        return min(entry.prediction.peak_bytes for entry in plan.entries
                   if entry.knobs.checkpoint_blocks == "none") / MB

    assert least_budget_without_checkpoints("jemalloc") < \
        0.7 * least_budget_without_checkpoints("glibc")


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_a_plan_says_which_allocators_heap_it_counted(qwen, host, allocator):
    workload = Workload(arch=qwen, seq_len=256, compute_dtype="float32")
    plan = make_plan(workload, dataclasses.replace(host, allocator=allocator))
    assert plan.to_json()["calibration"]["allocator"] == allocator
