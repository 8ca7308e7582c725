"""The MLP run a chunk of intermediate columns at a time (``mlp_intermediate_chunk``) gives the
untiled engine's loss and gradients (to summation order), decompresses each MLP weight once
per pass, and makes no (tokens, intermediate) tensor wider than a chunk."""

from __future__ import annotations

import pytest
import torch
import transformers
from engine_fixtures import random_batch

from mebp_core.config import EngineKnobs
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.mebp import count_valid_targets, run_mebp_step
from mebp_core.engine.model import load_engine_model
from mebp_core.lora.spec import LoraSpec
from mebp_core.store.pack import pack_model

INTERMEDIATE = 192  # chunk 64 divides it, 128 leaves a last chunk of 64
FAMILIES = ["llama", "qwen3", "gemma3_text"]
ALL = LoraSpec(rank=4, alpha=8.0, targets="all")
NO_MLP = LoraSpec(rank=4, alpha=8.0, targets=["q_proj", "v_proj", "o_proj"])


def _config(family: str):
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=INTERMEDIATE,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, rms_norm_eps=1e-6, mlp_bias=False)
    if family == "llama":
        return transformers.LlamaConfig(**common, tie_word_embeddings=False)
    common.pop("mlp_bias")
    if family == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=24, tie_word_embeddings=True)
    return transformers.Gemma3TextConfig(
        **common, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True)


@pytest.fixture(scope="module")
def wide_models(tmp_path_factory):
    """(family, quant) -> a packed tiny model whose intermediate size takes several chunks."""
    root = tmp_path_factory.mktemp("wide")

    class Packed(dict):
        def __missing__(self, key):
            family, quant = key
            hf_dir = root / f"hf-{family}"
            if not hf_dir.exists():
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(_config(family))
                with torch.no_grad():
                    for name, param in model.named_parameters():
                        if "norm" in name:
                            param.add_(torch.randn_like(param) * 0.1)
                model.save_pretrained(hf_dir)
            self[key] = pack_model(hf_dir, root / f"{family}-{quant}", quant=quant,
                                   group_size=32)
            return self[key]

    return Packed()


def step(packed_dir, *, spec=ALL, compute_dtype="float32", **knobs):
    """Loss, LoRA gradients and engine of one MeBP step from a seeded non-zero adapter."""
    engine = load_engine_model(packed_dir, lora_spec=spec, seed=1, compute_dtype=compute_dtype,
                               knobs=EngineKnobs(**knobs))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in engine.lora.values():
            weight = module.lora_B.weight
            weight.copy_(torch.randn(weight.shape, generator=gen) * 0.1)
    input_ids, labels = random_batch(300, seed=2)
    valid = count_valid_targets(labels)
    result = run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                           loss_scale=1.0 / valid)
    grads = {(path, kind): getattr(module, f"lora_{kind}").weight.grad
             for path, module in engine.lora.items() for kind in "AB"}
    return result.loss_sum / valid, grads, engine


def relative_error(actual: dict, expected: dict) -> float:
    return max(float((actual[k] - expected[k]).abs().max()
                     / expected[k].abs().max().clamp_min(1e-12)) for k in expected)


@pytest.mark.parametrize("chunk", [64, 128])
@pytest.mark.parametrize("family", FAMILIES)
def test_smoke(family, chunk, wide_models):
    loss0, g0, _ = step(wide_models[family, "none"])
    loss1, g1, _ = step(wide_models[family, "none"], mlp_intermediate_chunk=chunk)
    assert loss1 == pytest.approx(loss0, rel=1e-5)
    assert relative_error(g1, g0) <= 1e-4
