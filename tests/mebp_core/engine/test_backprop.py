"""Plain backprop (the one engine with ``BACKPROP_KNOBS``: frozen projections and head resident,
one autograd graph over the blocks and the full logits) gives MeBP's loss and gradients, for
every family."""

from __future__ import annotations

import math

import pytest
import torch
from engine_fixtures import FAMILIES, load_with_random_lora, random_batch

from mebp_core.config import BACKPROP_KNOBS, EngineKnobs, TrainConfig
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.frozen import FrozenLinear
from mebp_core.engine.mebp import count_valid_targets, evaluate_batch, run_mebp_step

RESIDENT = EngineKnobs(**BACKPROP_KNOBS)


def backprop_step(engine, input_ids, labels, loss_scale):
    """What method backprop runs: the whole-graph step, full logits."""
    return run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                         loss_scale=loss_scale, full_logits=True)


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
    resident = load_with_random_lora(packed, knobs=RESIDENT)

    actual = backprop_step(resident, input_ids, labels, scale)

    assert actual.loss_sum == pytest.approx(expected.loss_sum, rel=1e-6)
    assert (actual.valid_tokens, actual.correct_tokens) == (expected.valid_tokens,
                                                            expected.correct_tokens)
    want, got = lora_grads(lazy), lora_grads(resident)
    assert got.keys() == want.keys() and len(got) == 2 * len(resident.lora)
    worst = max(relative_error(got[name], want[name]) for name in want)
    assert worst <= 1e-5, f"{family} {quant}: worst LoRA gradient relative error {worst:.2e}"


def test_backprop_is_knob_settings_of_the_one_engine(packed_models):
    """A backprop config takes the resident knobs whatever it was given; the engine loaded
    with them holds every frozen projection and the head, counted as live."""
    config = TrainConfig(method="backprop", knobs=EngineKnobs(checkpoint_blocks=2,
                                                               mlp_chunk_tokens=64))
    assert config.knobs == EngineKnobs(**BACKPROP_KNOBS)
    assert TrainConfig.model_validate(config.model_dump(mode="json")) == config
    engine = load_with_random_lora(packed_models["llama", "int4"], knobs=config.knobs)
    resident = engine.working_set.resident
    projections = {m.weight_name for m in engine.arch.modules() if isinstance(m, FrozenLinear)}
    assert set(resident) == projections | {engine.arch.head_weight_name}
    assert all(not w.requires_grad and w.dtype == torch.float32 for w in resident.values())
    expected_bytes = sum(4 * math.prod(engine.store.info(name).shape) for name in resident)
    assert engine.working_set.resident_bytes == expected_bytes == engine.working_set.live_bytes


def test_resident_step_decompresses_nothing_and_accumulates(packed_models):
    engine = load_with_random_lora(packed_models["qwen2", "int4"], knobs=RESIDENT)  # tied head
    input_ids, labels = random_batch(300, seed=3)
    engine.working_set.reset_counters()

    backprop_step(engine, input_ids, labels, 0.5)
    assert engine.working_set.decompressed_params == 0
    half = {name: grad.clone() for name, grad in lora_grads(engine).items()}
    backprop_step(engine, input_ids, labels, 0.5)
    for name, grad in lora_grads(engine).items():
        torch.testing.assert_close(grad, 2 * half[name], rtol=1e-6, atol=0)


def test_resident_forward_equals_lazy_forward(packed_models):
    packed = packed_models["gemma3_text", "int4"]
    input_ids, labels = random_batch(300, seed=4)
    lazy = evaluate_batch(load_with_random_lora(packed), input_ids, labels)
    resident = evaluate_batch(load_with_random_lora(packed, knobs=RESIDENT), input_ids, labels)
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
    engine = load_with_random_lora(packed, compute_dtype="bfloat16",
                                   knobs=RESIDENT.model_copy(update={"bf16_matmul": "native"}))
    actual = backprop_step(engine, input_ids, labels, scale)
    assert actual.loss_sum == pytest.approx(expected.loss_sum, rel=1e-2)
    want, got = lora_grads(lazy), lora_grads(engine)
    worst = max(relative_error(got[name], want[name]) for name in want)
    assert worst <= 5e-2, f"bfloat16: worst LoRA gradient relative error {worst:.2e}"


def test_full_logits_are_only_for_the_whole_graph(packed_models):
    engine = load_with_random_lora(packed_models["qwen3", "int4"])  # checkpointed knobs
    input_ids, labels = random_batch(300, seed=6)
    with pytest.raises(ValueError, match="checkpoint_blocks none"):
        run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"), loss_scale=1.0,
                      full_logits=True)
