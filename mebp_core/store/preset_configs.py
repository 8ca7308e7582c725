"""Configs of the public architectures, keyed as in their Hugging Face config.json files
(torch-free: the API and the planner read them)."""

from __future__ import annotations

import copy
from typing import Any

from mebp_core.store.errors import PackError

# a model spec naming a preset: "preset:<name>"
PRESET_PREFIX = "preset:"


def _qwen2(hidden: int, inter: int, layers: int, heads: int, max_pos: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": max_pos,
        "max_window_layers": layers,
        "model_type": "qwen2",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": max_pos,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }


def _gemma3(
    hidden: int, inter: int, layers: int, heads: int, kv_heads: int, **extra: Any
) -> dict[str, Any]:
    pattern = 6
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "bos_token_id": 2,
        "cache_implementation": "hybrid",
        "eos_token_id": 1,
        "final_logit_softcapping": None,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "layer_types": [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(layers)
        ],
        "model_type": "gemma3_text",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0,
        "rope_theta": 1000000.0,
        "sliding_window_pattern": pattern,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        **extra,
    }


def _llama(**fields: Any) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "mlp_bias": False,
        "model_type": "llama",
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        **fields,
    }


# Presets whose trained weights ship in mebp_core/store/shipped/<name>/ (the rest are
# generated from a seed).
SHIPPED_PRESETS = frozenset({"pycode-12m"})

PRESET_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": _qwen2(896, 4864, 24, 14, 32768),
    "qwen2.5-1.5b": _qwen2(1536, 8960, 28, 12, 131072),
    "qwen2.5-3b": _qwen2(2048, 11008, 36, 16, 32768),
    "gemma3-1b": _gemma3(
        1152,
        6912,
        26,
        4,
        1,
        max_position_embeddings=32768,
        rope_scaling=None,
        sliding_window=512,
        vocab_size=262144,
    ),
    "gemma3-4b": _gemma3(
        2560,
        10240,
        34,
        8,
        4,
        max_position_embeddings=131072,
        rope_scaling={"factor": 8.0, "rope_type": "linear"},
        sliding_window=1024,
        vocab_size=262208,
    ),
    "llama3.2-1b": _llama(
        bos_token_id=128000,
        eos_token_id=128001,
        head_dim=64,
        hidden_size=2048,
        intermediate_size=8192,
        max_position_embeddings=131072,
        num_attention_heads=32,
        num_hidden_layers=16,
        num_key_value_heads=8,
        rope_scaling={
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        rope_theta=500000.0,
        vocab_size=128256,
    ),
    "smollm2-135m": _llama(
        bos_token_id=0,
        eos_token_id=0,
        hidden_size=576,
        initializer_range=0.041666666666666664,
        intermediate_size=1536,
        is_llama_config=True,
        max_position_embeddings=8192,
        num_attention_heads=9,
        num_hidden_layers=30,
        num_key_value_heads=3,
        rope_interleaved=False,
        rope_scaling=None,
        rope_theta=100000,
        vocab_size=49152,
    ),
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    # Pretrained on the Python stdlib with the byte tokenizer (benchmarks/pretrain_pycode.py);
    # its weights ship in mebp_core/store/shipped/, not generated.
    "pycode-12m": _llama(
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=258,
        head_dim=64,
        hidden_size=384,
        intermediate_size=1024,
        max_position_embeddings=1024,
        num_attention_heads=6,
        num_hidden_layers=8,
        num_key_value_heads=2,
        rope_scaling=None,
        rope_theta=10000.0,
        torch_dtype="float32",
        vocab_size=320,
    ),
    # For tests: qwen2-style, float32, 320 tokens so byte-level text (256 + specials) fits.
    "tiny": {
        **_qwen2(256, 768, 4, 4, 2048),
        "bos_token_id": 256,
        "eos_token_id": 257,
        "pad_token_id": 258,
        "sliding_window": 2048,
        "torch_dtype": "float32",
        "vocab_size": 320,
    },
}


def list_presets() -> list[str]:
    return sorted(PRESET_CONFIGS)


def preset_config(name: str) -> dict[str, Any]:
    try:
        return copy.deepcopy(PRESET_CONFIGS[name])
    except KeyError:
        raise PackError(f"unknown preset {name!r} (known: {', '.join(list_presets())})") from None
