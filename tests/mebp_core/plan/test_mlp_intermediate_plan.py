"""The planner's price of running a block's MLP a chunk of intermediate columns at a time
over every token (``mlp_intermediate_chunk``), against a chunk of tokens at a time over every
column (``mlp_chunk_tokens``): the same (tokens, intermediate) tensors, but each MLP weight
decompressed once per pass instead of once per chunk."""

from __future__ import annotations

import dataclasses

import pytest

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.grid import candidate_knobs, mlp_chunk_choices
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


@pytest.mark.parametrize(("dtype", "bf16_matmul"),
                         [("float32", "auto"), ("bfloat16", "native"), ("bfloat16", "float32")])
def test_the_grids_columns_are_equal_chunks_and_make_the_smallest_configuration(
        host, dtype, bf16_matmul):
    """Where a block runs its MLP by columns, the grid chunks them in equal widths, about
    the tensors of 64 tokens (1216 of 4864 columns at seq 256, four chunks; 256 at seq
    1024, nineteen), and tries no token chunks: the columns' configuration is the plan's
    smallest, and faster than token chunks, which decompress each MLP weight once per
    chunk. (A narrower last chunk cost the kernel 6-14 MB more, and 576 columns to fit the
    small tile ran 2.1 s a step against 1216's 1.6: BENCHMARKS.)"""
    arch = load_architecture("preset:qwen2.5-0.5b")
    for seq_len, width in ((256, 1216), (1024, 256)):
        workload = Workload(arch=arch, seq_len=seq_len, compute_dtype=dtype)
        grid = candidate_knobs(workload, bf16_matmul=bf16_matmul)
        assert {k.mlp_intermediate_chunk for k in grid} == {None, width}
        assert arch.intermediate_size % width == 0
        assert not any(k.mlp_chunk_tokens for k in grid)
    workload = Workload(arch=arch, seq_len=256, compute_dtype=dtype)
    entries = make_plan(workload, host, bf16_matmul=bf16_matmul).entries
    smallest = min(entries, key=lambda e: e.prediction.peak_bytes)
    assert smallest.knobs.mlp_intermediate_chunk == 1216
    by_tokens = predict(workload, smallest.knobs.model_copy(
        update={"mlp_intermediate_chunk": None, "mlp_chunk_tokens": 64}), host)
    assert smallest.prediction.step_time_s < 0.85 * by_tokens.step_time_s


def test_the_grid_falls_back_to_token_chunks_where_columns_cannot_run(host):
    """Gemma 3 norms its MLP's output before the sum: its grid chunks tokens."""
    gemma = Workload(arch=load_architecture("preset:gemma3-1b"), seq_len=256)
    grid = candidate_knobs(gemma)
    assert {k.mlp_chunk_tokens for k in grid} == {None, 64}
    assert not any(k.mlp_intermediate_chunk for k in grid)


@pytest.mark.parametrize(("intermediate", "seq_len", "width"), [
    (4864, 256, 1216),  # 4 equal chunks, a quarter
    (1536, 1024, 128),  # 64 and 128 as near to 96: the wider, fewer chunks
    (3008, 256, 768),  # 47 x 64: no equal width near 752, so 3 chunks and a narrower one
])
def test_the_grids_column_width_is_an_equal_chunk_near_64_tokens(intermediate, seq_len, width):
    arch = dataclasses.replace(load_architecture("preset:qwen2.5-0.5b"),
                               intermediate_size=intermediate)
    workload = Workload(arch=arch, seq_len=seq_len)
    assert mlp_chunk_choices(workload) == [{"mlp_intermediate_chunk": width}]


@pytest.mark.parametrize(("seq_len", "batch_size", "group_size", "width"), [
    (2048, 4, 64, 64),  # 8192 tokens, more than the 4864 columns: their float32 sums grow
    (2048, 1, 256, 256),  # columns of whole 256-groups, 1.7x the 152 of 64 tokens
])
def test_token_chunks_stay_where_columns_would_hold_more(seq_len, batch_size, group_size,
                                                         width):
    workload = Workload(arch=load_architecture("preset:qwen2.5-0.5b"), seq_len=seq_len,
                        batch_size=batch_size, group_size=group_size)
    assert mlp_chunk_choices(workload) == [{"mlp_intermediate_chunk": width},
                                           {"mlp_chunk_tokens": 64}]
