"""Plain backprop over resident weights gives MeBP's loss and gradients, for every family."""

from __future__ import annotations

import math

import pytest
import torch
from engine_fixtures import FAMILIES, load_with_random_lora, random_batch

from mebp_core.config import EngineKnobs
from mebp_core.engine.backprop import (
    ResidentEmbedding,
    ResidentLinear,
    find_resident_weights,
    make_resident,
    run_backprop_step,
)
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.frozen import FrozenEmbedding, FrozenLinear
from mebp_core.engine.mebp import count_valid_targets, evaluate_batch, run_mebp_step


def lora_grads(engine) -> dict[str, torch.Tensor]:
    return {name: param.grad for name, param in engine.arch.named_parameters()
            if param.requires_grad}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("quant", ["none", "int4"])
@pytest.mark.parametrize("family", FAMILIES)
def test_backprop_gradients_equal_mebp(family, quant, packed_models):
    packed = packed_models[family, quant]
    input_ids, labels = random_batch(300, seed=2)
    scale = 1.0 / count_valid_targets(labels)
    lazy = load_with_random_lora(packed)
    expected = run_mebp_step(lazy, input_ids, labels, make_checkpoints("ram"), loss_scale=scale)
    resident = load_with_random_lora(packed)
    make_resident(resident)

    actual = run_backprop_step(resident, input_ids, labels, loss_scale=scale)

    assert actual.loss_sum == pytest.approx(expected.loss_sum, rel=1e-6)
    assert (actual.valid_tokens, actual.correct_tokens) == (expected.valid_tokens,
                                                            expected.correct_tokens)
    want, got = lora_grads(lazy), lora_grads(resident)
    assert got.keys() == want.keys() and len(got) == 2 * len(resident.lora)
    worst = max(relative_error(got[name], want[name]) for name in want)
    assert worst <= 1e-5, f"{family} {quant}: worst LoRA gradient relative error {worst:.2e}"


def test_make_resident_swaps_every_frozen_module(packed_models):
    engine = load_with_random_lora(packed_models["llama", "int4"])
    resident_bytes = make_resident(engine)

    modules = list(engine.arch.modules())
    assert not any(isinstance(m, FrozenLinear | FrozenEmbedding) for m in modules)
    assert all(isinstance(m.base, ResidentLinear) for m in engine.lora.values())
    assert isinstance(engine.arch.model.embed_tokens, ResidentEmbedding)
    weights = find_resident_weights(engine)
    assert all(not w.requires_grad and w.dtype == torch.float32 for w in weights.values())
    store = engine.store
    expected_bytes = sum(4 * math.prod(store.info(name).shape) for name in weights)
    assert resident_bytes == expected_bytes == engine.working_set.live_bytes
    assert make_resident(engine) == resident_bytes  # idempotent
    assert engine.working_set.live_bytes == resident_bytes


def test_resident_step_decompresses_nothing_and_accumulates(packed_models):
    engine = load_with_random_lora(packed_models["qwen2", "int4"])  # tied head
    make_resident(engine)
    input_ids, labels = random_batch(300, seed=3)
    engine.working_set.reset_counters()

    run_backprop_step(engine, input_ids, labels, loss_scale=0.5)
    assert engine.working_set.decompressed_params == 0
    half = {name: grad.clone() for name, grad in lora_grads(engine).items()}
    run_backprop_step(engine, input_ids, labels, loss_scale=0.5)
    for name, grad in lora_grads(engine).items():
        torch.testing.assert_close(grad, 2 * half[name], rtol=1e-6, atol=0)


def test_resident_forward_equals_lazy_forward(packed_models):
    packed = packed_models["gemma3_text", "int4"]
    input_ids, labels = random_batch(300, seed=4)
    lazy = evaluate_batch(load_with_random_lora(packed), input_ids, labels)
    engine = load_with_random_lora(packed)
    make_resident(engine)
    resident = evaluate_batch(engine, input_ids, labels)
    assert resident.loss_sum == pytest.approx(lazy.loss_sum, rel=1e-6)
    assert resident.correct_tokens == lazy.correct_tokens


def test_bfloat16_backprop_close_to_mebp(packed_models):
    """The plain-backprop reference runs its matmuls in bf16, so MeBP does too here."""
    packed = packed_models["qwen3", "int4"]
    input_ids, labels = random_batch(300, seed=5)
    scale = 1.0 / count_valid_targets(labels)
    native = EngineKnobs(bf16_matmul="native")
    lazy = load_with_random_lora(packed, compute_dtype="bfloat16", knobs=native)
    expected = run_mebp_step(lazy, input_ids, labels, make_checkpoints("ram"), loss_scale=scale)
    engine = load_with_random_lora(packed, compute_dtype="bfloat16", knobs=native)
    make_resident(engine)
    actual = run_backprop_step(engine, input_ids, labels, loss_scale=scale)
    assert actual.loss_sum == pytest.approx(expected.loss_sum, rel=1e-2)
    want, got = lora_grads(lazy), lora_grads(engine)
    worst = max(relative_error(got[name], want[name]) for name in want)
    assert worst <= 5e-2, f"bfloat16: worst LoRA gradient relative error {worst:.2e}"


def test_mebp_step_on_a_resident_engine_is_unchanged(packed_models):
    """``make_resident`` also serves MeBP as the "weights kept decompressed" setting."""
    packed = packed_models["gemma3_text", "int4"]
    input_ids, labels = random_batch(300, seed=6)
    lazy = load_with_random_lora(packed)
    expected = run_mebp_step(lazy, input_ids, labels, make_checkpoints("ram"), loss_scale=0.1)
    engine = load_with_random_lora(packed)
    make_resident(engine)
    engine.working_set.reset_counters()
    actual = run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"), loss_scale=0.1)
    assert actual.loss_sum == pytest.approx(expected.loss_sum, rel=1e-6)
    want, got = lora_grads(lazy), lora_grads(engine)
    assert max(relative_error(got[name], want[name]) for name in want) <= 1e-5
    head = engine.store.info(engine.arch.head_weight_name).shape
    assert engine.working_set.decompressed_params == math.prod(head)  # only the tiled head
