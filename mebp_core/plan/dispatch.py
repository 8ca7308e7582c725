"""The torch ops a step dispatches, which each cost the host a fixed overhead: a block's
passes (their MLP's again per extra chunk) and the loss's vocabulary tiles."""

from __future__ import annotations

from types import MappingProxyType

from mebp_core.config import EngineKnobs
from mebp_core.plan.passes import LOSS_PASSES, pass_counts
from mebp_core.plan.workload import (
    Workload,
    adapted_projections,
    matmul_bytes,
    mlp_chunks,
    mlp_column_chunks,
    vocab_tiles,
)

OPS_PER_BLOCK_FORWARD = 100  # torch ops dispatched by one block's forward (backward ~2x)
OPS_PER_MLP_FORWARD = 30  # of those, its MLP part's (run again per extra chunk of tokens)
# torch ops a loss pass dispatches per vocabulary tile (plain backprop's logits are whole).
# Counted with torch.profiler as the difference between two tile sizes (qwen2.5-0.5b, 227
# tiles apart, and smollm2-135m, 661 apart: the same to the op) in native bf16, the most
# (float32: 67 and 57). Uncounted, 1 MB tiles of a 152k vocabulary (260 of them, about 0.1
# s of dispatch) were priced faster than 8 MB ones on a Zen 4, and ran slower.
OPS_PER_LOSS_TILE = MappingProxyType({"mebp": 75, "mezo": 61, "backprop": 0})


def block_ops(workload: Workload, knobs: EngineKnobs) -> float:
    """Ops the blocks' passes dispatch a step."""
    passes = pass_counts(workload, knobs)
    forwards = passes["tiled_forward"] + passes["whole_forward"]
    backwards = passes["tiled_backward"] + passes["whole_backward"]
    # each chunk, of tokens or of intermediate columns, runs the MLP's ops again
    extra_chunks = mlp_chunks(workload, knobs) * mlp_column_chunks(workload, knobs) - 1
    # MeSP's recompute of h = xA: one more matmul per adapted projection in each backward
    recompute_h = 0 if knobs.lora_hidden == "store" else len(adapted_projections(workload))
    return (forwards + 2 * backwards) * (OPS_PER_BLOCK_FORWARD +
                                         extra_chunks * OPS_PER_MLP_FORWARD) + \
        backwards * recompute_h


def loss_tile_ops(workload: Workload, knobs: EngineKnobs) -> float:
    """Ops the loss's vocabulary tiles dispatch a step, in every loss pass."""
    tiles = vocab_tiles(workload.arch, knobs.loss_vocab_tile_bytes,
                        matmul_bytes(workload, knobs))
    return tiles * OPS_PER_LOSS_TILE[workload.method] * LOSS_PASSES[workload.method]
