"""Config parsing against transformers on hub-style (4.x) config.json files, built on meta."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from mebp_core.models import UnknownArchitectureError, build_model, gemma3_text
from mebp_core.models.base import UnsupportedConfigError, compute_inv_freq

# Shapes and rope fields as in the hub's config.json files of the named checkpoints
HUB_CONFIGS: dict[str, dict[str, Any]] = {
    "Llama-3.2-1B": {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 16,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "vocab_size": 128256,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
    "SmolLM2-135M": {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 30,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "vocab_size": 49152,
    },
    "Qwen2.5-0.5B": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "num_hidden_layers": 24,
        "max_position_embeddings": 32768,
        "max_window_layers": 21,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-6,
    },
    "Qwen3-0.6B": {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "head_dim": 128,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "num_hidden_layers": 28,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
        "attention_bias": False,
    },
    "gemma-3-1b-it": {
        "model_type": "gemma3_text",
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "head_dim": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "num_hidden_layers": 26,
        "max_position_embeddings": 32768,
        "query_pre_attn_scalar": 256,
        "rope_local_base_freq": 10000,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "vocab_size": 262144,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    },
    "gemma-3-4b-it": {
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_attention_heads": 8,
            "num_hidden_layers": 34,
            "num_key_value_heads": 4,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "vision_config": {
            "hidden_size": 1152,
            "image_size": 896,
            "model_type": "siglip_vision_model",
            "patch_size": 14,
        },
    },
}
ROTARY = {
    "llama": LlamaRotaryEmbedding,
    "qwen2": Qwen2RotaryEmbedding,
    "qwen3": Qwen3RotaryEmbedding,
    "gemma3_text": Gemma3RotaryEmbedding,
}
ARG_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "tie_word_embeddings",
    "rms_norm_eps",
)


def make_hf_text_config(config: dict[str, Any]):
    config = copy.deepcopy(config)
    hf = AutoConfig.for_model(config.pop("model_type"), **config)
    if not hasattr(hf, "text_config"):
        return hf
    # a multimodal model's head is tied as its outer config says: transformers' tying reads it
    hf.text_config.tie_word_embeddings = bool(hf.tie_word_embeddings)
    return hf.text_config


@pytest.fixture(params=sorted(HUB_CONFIGS))
def hub(request) -> tuple[dict[str, Any], Any]:
    config = HUB_CONFIGS[request.param]
    return config, make_hf_text_config(config)


def test_args_match_transformers(hub):
    config, hf = hub
    with torch.device("meta"):
        args = build_model(copy.deepcopy(config)).args
    # Qwen2Config has no head_dim attribute; transformers derives it as below
    assert args.head_dim == (
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    )
    for field in ARG_FIELDS:
        assert getattr(args, field) == getattr(hf, field), field
    assert args.layer_types == tuple(getattr(hf, "layer_types", args.layer_types))
    sliding = "sliding_attention" in args.layer_types
    assert (args.sliding_window if sliding else None) == (hf.sliding_window if sliding else None)


def test_inv_freq_matches_transformers(hub):
    config, hf = hub
    with torch.device("meta"):
        args = build_model(copy.deepcopy(config)).args
    rotary = ROTARY[hf.model_type](hf)
    for layer_type in set(args.layer_types):
        name = "inv_freq" if hf.model_type != "gemma3_text" else f"{layer_type}_inv_freq"
        expected = getattr(rotary, name)
        assert torch.equal(compute_inv_freq(args.rope[layer_type], args.head_dim), expected)


def test_meta_build_has_transformers_parameters(hub):
    config, hf = hub
    with torch.device("meta"):
        ours = build_model(copy.deepcopy(config))
        reference = AutoModelForCausalLM.from_config(hf)
    expected = {n: p.shape for n, p in reference.named_parameters()}  # tied head is deduplicated
    assert {n: p.shape for n, p in ours.named_parameters()} == expected
    assert ours.head_weight_name in expected
    for name, module in ours.named_modules():
        if name.endswith("_proj") or name == "lm_head":
            assert type(module) is nn.Linear, name
    assert type(ours.model.embed_tokens) is nn.Embedding


def test_multimodal_gemma3_builds_text_model():
    with torch.device("meta"):
        model = build_model(copy.deepcopy(HUB_CONFIGS["gemma-3-4b-it"]))
    assert isinstance(model, gemma3_text.Model)
    assert model.args.rope["full_attention"].rope_type == "linear"
    assert model.args.rope["sliding_attention"].rope_theta == 10_000.0
    assert model.head_weight_name == "model.embed_tokens.weight"


def test_unknown_model_type_is_refused():
    with pytest.raises(UnknownArchitectureError):
        build_model({"model_type": "mistral"})


def test_unsupported_rope_type_is_refused():
    config = {**HUB_CONFIGS["Qwen2.5-0.5B"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(UnsupportedConfigError):
        build_model(config)
