"""The planner's price of running a block's MLP a chunk of intermediate columns at a time
over every token (``mlp_intermediate_chunk``), against a chunk of tokens at a time over every
column (``mlp_chunk_tokens``): the same (tokens, intermediate) tensors, but each MLP weight
decompressed once per pass instead of once per chunk."""

from __future__ import annotations

import pytest

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import load_architecture
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
