"""A block recomputed for its backward skips the product whose output only enters the block's
output sum (a pre-norm block's down projection): the backward never reads it, so the
gradients are the same bits as recomputing it, with one product less per block and, when
the recompute decompresses in tiles, that projection's tiles less."""

from __future__ import annotations

import pytest
import torch
import transformers
from engine_fixtures import random_batch
from test_exactness import engine_gradients, write_random_adapter

from mebp_core.models.base import PreNormBlock

SETTINGS = {
    "shared": {},
    "unshared-small-tiles": dict(share_decompression=False, decompress_tile_bytes=1 << 16,
                                 loss_vocab_tile_bytes=1 << 16),
    "mlp-chunks-shared": dict(mlp_chunk_tokens=7),
    "mlp-chunks-unshared": dict(mlp_chunk_tokens=16, share_decompression=False,
                                decompress_tile_bytes=1 << 16, checkpoint_blocks=2),
    "resident": dict(frozen_weights="resident", resident_weight_bytes=40_000),
    "graph-tail-1": dict(graph_tail_blocks=1),
    # bf16 storage, float32 matmuls (the AVX2 hosts' path): the backward upcasts the weight
    # it decompresses itself
    "upcast-shared": dict(bf16_matmul="float32", share_decompression=True),
    "upcast-shared-mlp-chunks": dict(bf16_matmul="float32", share_decompression=True,
                                     mlp_chunk_tokens=7),
}


def gradients(monkeypatch, tiny_models, packed_models, tmp_path, *, skip: bool, dtype: str,
              **knobs):
    """The LoRA gradients and the engine, with the recompute's skip on or off (every block
    then says its output projection's output is read, as before the skip)."""
    with monkeypatch.context() as patch:
        if not skip:
            patch.setattr(PreNormBlock, "residual_output_projection", lambda self: None)
        adapter = write_random_adapter(tiny_models["llama"], tmp_path / "adapter", seed=31)
        input_ids, labels = random_batch(300, seed=32)
        _, grads, engine = engine_gradients(packed_models["llama", "int4"], adapter,
                                            input_ids, labels, compute_dtype=dtype, **knobs)
    return grads, engine


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_skipping_the_residual_output_product_gives_the_same_gradients_bit_for_bit(
        setting, dtype, monkeypatch, tiny_models, packed_models, tmp_path):
    recomputed, before = gradients(monkeypatch, tiny_models, packed_models, tmp_path,
                                   skip=False, dtype=dtype, **SETTINGS[setting])
    skipped, engine = gradients(monkeypatch, tiny_models, packed_models, tmp_path, skip=True,
                                dtype=dtype, **SETTINGS[setting])
    assert skipped.keys() == recomputed.keys()
    for key in recomputed:
        assert torch.equal(skipped[key], recomputed[key]), key
    # the weights live at once are those of the recompute that decompressed them all
    assert (engine.working_set.peak_bytes, engine.working_set.max_live_blocks) == \
        (before.working_set.peak_bytes, before.working_set.max_live_blocks)
    assert engine.working_set.live_bytes == engine.working_set.resident_bytes
    assert engine.working_set.shared is None
    assert not any(getattr(block.mlp.down_proj, "base", block.mlp.down_proj).output_unused
                   for block in engine.layers)


@pytest.mark.parametrize("setting", ["unshared-small-tiles", "mlp-chunks-unshared"])
def test_an_unshared_recompute_decompresses_no_tile_of_the_skipped_projection(
        setting, monkeypatch, tiny_models, packed_models, tmp_path):
    _, before = gradients(monkeypatch, tiny_models, packed_models, tmp_path, skip=False,
                          dtype="float32", **SETTINGS[setting])
    _, after = gradients(monkeypatch, tiny_models, packed_models, tmp_path, skip=True,
                         dtype="float32", **SETTINGS[setting])
    config = transformers.AutoConfig.from_pretrained(tiny_models["llama"])
    down = config.hidden_size * config.intermediate_size
    # the recompute of every block passes its MLP in one chunk, or in 3 of 16 of 40 tokens
    passes = 3 if "chunks" in setting else 1
    saved = before.working_set.decompressed_params - after.working_set.decompressed_params
    assert saved == down * passes * config.num_hidden_layers
