"""Memory counters: never more than one block's weights decompressed, checkpoints as computed."""

from __future__ import annotations

import torch
from engine_fixtures import LORA, random_batch

from mebp_core.config import EngineKnobs
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.mebp import count_valid_targets, evaluate_batch, run_mebp_step
from mebp_core.engine.model import load_engine_model

TILE_BYTES = 1 << 16


def block_weight_bytes(engine, block: int) -> int:
    """Bytes of block ``block``'s projections decompressed in the compute dtype."""
    prefix = f"model.layers.{block}."
    element = torch.empty((), dtype=engine.dtype).element_size()
    total = 0
    for name in engine.store.names():
        shape = engine.store.info(name).shape
        if name.startswith(prefix) and len(shape) == 2:
            total += shape[0] * shape[1] * element
    return total


def run_step(packed, **knobs):
    engine = load_engine_model(packed, lora_spec=LORA, knobs=EngineKnobs(**knobs))
    input_ids, labels = random_batch(300, seed=0)
    run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                  loss_scale=1.0 / count_valid_targets(labels))
    return engine


def test_shared_decompression_holds_at_most_one_block(packed_models):
    engine = run_step(packed_models["llama", "int4"], share_decompression=True,
                      decompress_tile_bytes=TILE_BYTES, loss_vocab_tile_bytes=TILE_BYTES)
    ws = engine.working_set
    largest_block = max(block_weight_bytes(engine, i) for i in range(len(engine.layers)))
    assert ws.max_live_blocks == 1
    assert 0 < ws.peak_bytes <= largest_block
    assert ws.live_bytes == 0 and not ws.live_blocks  # everything released after the step


def test_tiled_decompression_holds_at_most_one_tile(packed_models):
    engine = run_step(packed_models["llama", "int4"], share_decompression=False,
                      decompress_tile_bytes=TILE_BYTES, loss_vocab_tile_bytes=TILE_BYTES)
    ws = engine.working_set
    assert ws.max_live_blocks == 1
    assert 0 < ws.peak_bytes <= TILE_BYTES
    assert ws.live_bytes == 0


def test_forward_decompresses_every_weight_once(packed_models):
    engine = load_engine_model(packed_models["qwen2", "int4"], lora_spec=LORA)
    input_ids, labels = random_batch(300, seed=1)
    engine.working_set.reset_counters()
    evaluate_batch(engine, input_ids, labels)
    store = engine.store
    matrices = [n for n in store.names() if len(store.info(n).shape) == 2]
    expected = sum(store.info(n).shape[0] * store.info(n).shape[1] for n in matrices)
    # every projection once, plus the (tied) head once; the embedding is only gathered by rows
    assert engine.working_set.decompressed_params == expected


def test_tiled_and_shared_modes_give_identical_gradients(packed_models):
    grads = []
    for shared in (True, False):
        engine = run_step(packed_models["gemma3_text", "int4"], share_decompression=shared,
                          decompress_tile_bytes=TILE_BYTES)
        grads.append([p.grad.clone() for p in engine.lora_parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_block_sized_buffer_lives_only_during_the_backward(packed_models):
    engine = load_engine_model(packed_models["llama", "int4"], lora_spec=LORA,
                               knobs=EngineKnobs(decompress_tile_bytes=TILE_BYTES))
    input_ids, labels = random_batch(300, seed=2)
    sizes = []

    def record(index: int) -> None:
        sizes.append(engine.working_set._shared.nbytes)

    for _ in range(2):
        run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                      loss_scale=1.0 / count_valid_targets(labels), on_block_done=record)
        assert engine.working_set._shared.nbytes == 0  # released after the backward
        assert engine.working_set._tiles.nbytes <= TILE_BYTES
    largest_block = max(block_weight_bytes(engine, i) for i in range(len(engine.layers)))
    second_step = sizes[len(engine.layers):]
    assert set(second_step) == {largest_block}  # one buffer, sized to one block's weights


def test_only_lora_parameters_receive_gradients(packed_models):
    engine = run_step(packed_models["qwen2", "int4"])
    lora = {id(p) for p in engine.lora_parameters()}
    with_grad = [name for name, p in engine.arch.named_parameters() if p.grad is not None]
    assert with_grad and all(".lora_" in name for name in with_grad)
    assert all(not p.requires_grad for p in engine.arch.parameters() if id(p) not in lora)


def test_checkpoints_hold_one_block_input_per_block(packed_models, tmp_path):
    for storage in ("ram", "mmap"):
        engine = load_engine_model(packed_models["qwen3", "int4"], lora_spec=LORA)
        checkpoints = make_checkpoints(storage, tmp_path)
        input_ids, labels = random_batch(300, seed=3)
        run_mebp_step(engine, input_ids, labels, checkpoints,
                      loss_scale=1.0 / count_valid_targets(labels))
        expected = len(engine.layers) * input_ids.numel() * engine.arch.args.hidden_size * 4
        assert checkpoints.peak_nbytes == expected  # L x (B, T, D) float32
        assert checkpoints.nbytes == 0  # all popped by the backward
