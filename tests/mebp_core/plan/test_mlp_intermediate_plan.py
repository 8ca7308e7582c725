"""The planner's price of running a block's MLP a chunk of intermediate columns at a time
over every token (``mlp_intermediate_chunk``), against a chunk of tokens at a time over every
column (``mlp_chunk_tokens``): the same (tokens, intermediate) tensors, but each MLP weight
decompressed once per pass instead of once per chunk."""

from __future__ import annotations

import pytest

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.grid import SMALL_TILE_BYTES, candidate_knobs
from mebp_core.plan.planner import make_plan
from mebp_core.plan.predict import predict
from mebp_core.plan.timing import step_work
from mebp_core.plan.workload import Workload

# the smallest configurations: lazy, unshared small tiles, every block checkpointed
SMALL = {"frozen_weights": "lazy", "checkpoint_blocks": 1, "checkpoint_storage": "mmap",
         "share_decompression": False, "decompress_tile_bytes": 1 << 20,
         "loss_vocab_tile_bytes": 1 << 20}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_quarter_of_the_columns_costs_a_quarter_of_the_tokens_memory_and_less_time(
        host, dtype):
    workload = Workload(arch=load_architecture("preset:qwen2.5-0.5b"), seq_len=256,
                        compute_dtype=dtype)
    width = workload.arch.intermediate_size // 4  # 1216 = 19 x 64
    whole = EngineKnobs(**SMALL)
    tokens = EngineKnobs(**SMALL, mlp_chunk_tokens=workload.tokens // 4)
    columns = EngineKnobs(**SMALL, mlp_intermediate_chunk=width)
    by_tokens, by_columns, unchunked = (predict(workload, k, host)
                                        for k in (tokens, columns, whole))
    # the (tokens, intermediate) tensors shrink alike; the input gradient summed whole and
    # the token dimension's hidden-sized parts differ by at most a few MB
    assert by_columns.memory["activations"] < unchunked.memory["activations"]
    assert by_columns.memory["activations"] == pytest.approx(
        by_tokens.memory["activations"], abs=8 << 20)
    # each MLP weight decompressed once per pass, as unchunked: a quarter of token chunks'
    work = {k: step_work(workload, knobs, frozenset())
            for k, knobs in (("tokens", tokens), ("columns", columns), ("whole", whole))}
    assert work["columns"].tile_params == work["whole"].tile_params
    assert work["tokens"].tile_params > 2 * work["columns"].tile_params
    assert by_columns.time["decompress"] < by_tokens.time["decompress"] / 2
    assert by_columns.step_time_s < by_tokens.step_time_s
    # the chunks' ops are dispatched again, like the token chunks'
    assert work["columns"].ops == work["tokens"].ops > work["whole"].ops


def test_a_chunk_as_wide_as_the_intermediate_size_is_no_chunk(workload, host):
    whole = EngineKnobs(**SMALL)
    wide = EngineKnobs(**SMALL, mlp_intermediate_chunk=workload.arch.intermediate_size + 64)
    assert predict(workload, wide, host) == predict(workload, whole, host)


def test_gemma3s_column_chunks_pay_for_making_the_mlps_output_first(host):
    """Gemma 3 norms its MLP's output before the sum, so a backward in column chunks makes
    that output first: gate and up once more per block backward, and the output with its
    float32 sum alive beside the block's gradients."""
    workload = Workload(arch=load_architecture("preset:gemma3-1b"), seq_len=256)
    width = workload.arch.intermediate_size // 4
    by_tokens = predict(workload, EngineKnobs(**SMALL, mlp_chunk_tokens=64), host)
    by_columns = predict(workload, EngineKnobs(**SMALL, mlp_intermediate_chunk=width), host)
    work = step_work(workload, EngineKnobs(**SMALL, mlp_intermediate_chunk=width),
                     frozenset())
    untiled = step_work(workload, EngineKnobs(**SMALL), frozenset())
    arch = workload.arch
    gate_and_up = 2 * arch.hidden_size * arch.intermediate_size * arch.num_layers
    backwards = arch.num_layers  # checkpointed every block: one backward each
    assert work.tile_params == pytest.approx(
        untiled.tile_params + gate_and_up * backwards / arch.num_layers)
    n_by_d = workload.tokens * arch.hidden_size
    assert by_columns.memory["activations"] >= by_tokens.memory["activations"] + n_by_d * 4


@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
def test_the_grid_chunks_columns_in_whole_quantization_groups(group_size):
    workload = Workload(arch=load_architecture("preset:qwen2.5-0.5b"), seq_len=256,
                        group_size=group_size)
    widths = [k.mlp_intermediate_chunk for k in candidate_knobs(workload)
              if k.mlp_intermediate_chunk is not None]
    assert widths and all(w % group_size == 0 and w % 64 == 0 for w in widths)
    gemma = Workload(arch=load_architecture("preset:gemma3-1b"), seq_len=256)
    assert not any(k.mlp_intermediate_chunk for k in candidate_knobs(gemma))


@pytest.mark.parametrize(("dtype", "bf16_matmul", "matmul_bytes"),
                         [("float32", "auto", 4), ("bfloat16", "native", 2),
                          ("bfloat16", "float32", 4)])
def test_the_grids_columns_fit_a_small_tile_and_make_the_smallest_configuration(
        host, dtype, bf16_matmul, matmul_bytes):
    """A chunk's slice of a weight is decompressed whole: the grid keeps it within the small
    tile, so the columns' configuration is the plan's smallest (a quarter of the columns,
    1216 at seq 256, made 2.1 MB slices in bf16 and was priced above the token chunks), and
    faster than the token chunks, which decompress each MLP weight once per chunk."""
    workload = Workload(arch=load_architecture("preset:qwen2.5-0.5b"), seq_len=256,
                        compute_dtype=dtype)
    widths = {k.mlp_intermediate_chunk for k in candidate_knobs(workload,
                                                                bf16_matmul=bf16_matmul)
              if k.mlp_intermediate_chunk is not None}
    assert widths
    assert all(w * workload.arch.hidden_size * matmul_bytes <= SMALL_TILE_BYTES for w in widths)
    entries = make_plan(workload, host, bf16_matmul=bf16_matmul).entries
    smallest = min(entries, key=lambda e: e.prediction.peak_bytes)
    by_tokens = min((e for e in entries if e.knobs.mlp_chunk_tokens),
                    key=lambda e: e.prediction.peak_bytes)
    assert smallest.knobs.mlp_intermediate_chunk in widths
    assert smallest.ranking_time_s < 0.85 * by_tokens.ranking_time_s
