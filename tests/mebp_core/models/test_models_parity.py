"""Our architectures against transformers on the same saved random weights.

Error measure: max|ours - hf| / max|hf| over the whole tensor.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models_reference import (
    CASES,
    SEQ_LEN,
    TINY,
    SavedModel,
    load_ours,
    make_input_ids,
    relative_error,
    to_v4_config,
)
from transformers import AutoConfig, AutoModelForCausalLM

from mebp_core.models import build_model

FLOAT32_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-5
# one differing bf16 op moves these logits by ~5e-3, so this demands op-for-op equal math
BFLOAT16_TOLERANCE = 1e-3


@pytest.mark.parametrize("style", ["v5", "v4"])
def test_logits_match_transformers(saved: SavedModel, style: str):
    config = saved.config() if style == "v5" else to_v4_config(saved.config())
    ours = load_ours(config, saved.path)
    input_ids = make_input_ids(ours.args.vocab_size)
    with torch.no_grad():
        expected = saved.hf(input_ids).logits  # (B, T, V)
        logits = ours(input_ids)
    assert logits.shape == expected.shape
    assert relative_error(logits, expected) <= FLOAT32_TOLERANCE


def run_blockwise(model, h: torch.Tensor) -> torch.Tensor:
    """The engine's path: context once, block by block, final norm, head by name."""
    ctx = model.make_context(h.shape[1], h.device, h.dtype)
    for layer in model.model.layers:
        h = layer(h, ctx)
    head = model.get_parameter(model.head_weight_name)
    logits = F.linear(model.final_norm(h), head)
    if model.logit_softcap is not None:
        logits = torch.tanh(logits / model.logit_softcap) * model.logit_softcap
    return logits  # (B, T, V)


def test_gradients_match_transformers(saved: SavedModel):
    ours = load_ours(saved.config(), saved.path)
    input_ids = make_input_ids(ours.args.vocab_size)
    labels = make_input_ids(ours.args.vocab_size).roll(1, dims=1)
    with torch.no_grad():
        embeds = ours.embed(input_ids)  # (B, T, D)
    ours_embeds = embeds.clone().requires_grad_()
    hf_embeds = embeds.clone().requires_grad_()

    logits = run_blockwise(ours, ours_embeds)
    F.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
    hf_logits = saved.hf(inputs_embeds=hf_embeds).logits
    F.cross_entropy(hf_logits.flatten(0, 1), labels.flatten()).backward()

    assert relative_error(ours_embeds.grad, hf_embeds.grad) <= GRAD_TOLERANCE
    hf_params = dict(saved.hf.named_parameters())
    compared = 0
    for name, param in ours.named_parameters():
        # untied embeddings get no gradient when the block input is given directly
        assert (param.grad is None) == (hf_params[name].grad is None), name
        if param.grad is None:
            continue
        compared += 1
        assert relative_error(param.grad, hf_params[name].grad) <= GRAD_TOLERANCE, name
    assert compared >= len(hf_params) - 1


def test_embed_includes_scale(saved: SavedModel):
    ours = load_ours(saved.config(), saved.path)
    input_ids = make_input_ids(ours.args.vocab_size)
    with torch.no_grad():
        expected = saved.hf.get_input_embeddings()(input_ids)
        assert torch.equal(ours.embed(input_ids), expected)


def test_bfloat16_logits_match_transformers(saved: SavedModel):
    ours = load_ours(saved.config(), saved.path).to(torch.bfloat16)
    # from_pretrained keeps rotary inv_freq in float32 (a later .to(bfloat16) would round it)
    hf = AutoModelForCausalLM.from_pretrained(saved.path, dtype=torch.bfloat16).eval()
    input_ids = make_input_ids(ours.args.vocab_size)
    with torch.no_grad():
        logits = ours(input_ids)
        expected = hf(input_ids).logits
    assert logits.dtype == torch.bfloat16
    assert relative_error(logits, expected) <= BFLOAT16_TOLERANCE


@pytest.mark.parametrize("name", ["qwen2_sliding", "gemma3_sliding_tied", "gemma3_linear_rope"])
def test_sliding_cases_exceed_their_window(name: str):
    """Guards the cases meant to exercise the sliding-window mask and mixed layer types."""
    model_type, kwargs = CASES[name]
    config = AutoConfig.for_model(model_type, **{**TINY, **kwargs}).to_dict()
    with torch.device("meta"):
        model = build_model(config)
    assert {"sliding_attention", "full_attention"} <= set(model.args.layer_types)
    assert model.args.sliding_window < SEQ_LEN
    ctx = model.make_context(SEQ_LEN, torch.device("cpu"), torch.float32)
    assert ctx.masks["sliding_attention"] is not None
    assert ctx.masks["full_attention"] is None
