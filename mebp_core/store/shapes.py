"""The tensor names and shapes a config implies, in Hugging Face ``*ForCausalLM`` naming.

Packing checks a checkpoint against this, presets generate exactly these tensors, and
parameter counts come from it without materializing anything.
"""

from __future__ import annotations

from typing import Any

from mebp_core.models import UnknownArchitectureError, text_config

Shape = tuple[int, ...]
SUPPORTED_MODEL_TYPES = ("gemma3_text", "llama", "qwen2", "qwen3")


def full_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text config with transformers' defaults filled in (hub configs omit defaults)."""
    from transformers import AutoConfig

    text = text_config(config)
    model_type = text.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        known = ", ".join(SUPPORTED_MODEL_TYPES)
        raise UnknownArchitectureError(
            f"config.json: model_type {config.get('model_type')!r} is not supported "
            f"(known: {known}, gemma3)"
        )
    full = AutoConfig.for_model(**text).to_dict()
    if "tie_word_embeddings" in config and config.get("model_type") == "gemma3":
        full["tie_word_embeddings"] = config["tie_word_embeddings"]
    return full


def _layer_shapes(c: dict[str, Any], model_type: str) -> dict[str, Shape]:
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    attn = {
        "q_proj": (heads * head_dim, hidden),
        "k_proj": (kv_heads * head_dim, hidden),
        "v_proj": (kv_heads * head_dim, hidden),
        "o_proj": (hidden, heads * head_dim),
    }
    shapes: dict[str, Shape] = {"input_layernorm.weight": (hidden,)}
    for proj, shape in attn.items():
        shapes[f"self_attn.{proj}.weight"] = shape
        has_bias = proj != "o_proj" if model_type == "qwen2" else c.get("attention_bias")
        if has_bias:
            shapes[f"self_attn.{proj}.bias"] = (shape[0],)
    if model_type in ("qwen3", "gemma3_text"):
        shapes["self_attn.q_norm.weight"] = (head_dim,)
        shapes["self_attn.k_norm.weight"] = (head_dim,)
    shapes["post_attention_layernorm.weight"] = (hidden,)
    if model_type == "gemma3_text":
        shapes["pre_feedforward_layernorm.weight"] = (hidden,)
        shapes["post_feedforward_layernorm.weight"] = (hidden,)
    mlp = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    for proj, shape in mlp.items():
        shapes[f"mlp.{proj}.weight"] = shape
        if c.get("mlp_bias"):
            shapes[f"mlp.{proj}.bias"] = (shape[0],)
    return shapes


def expected_shapes(config: dict[str, Any]) -> dict[str, Shape]:
    """Every tensor of the text model, in checkpoint order: embeddings, layers, norm, head."""
    c = full_text_config(config)
    model_type = c["model_type"]
    shapes: dict[str, Shape] = {"model.embed_tokens.weight": (c["vocab_size"], c["hidden_size"])}
    layer = _layer_shapes(c, model_type)
    for i in range(c["num_hidden_layers"]):
        for name, shape in layer.items():
            shapes[f"model.layers.{i}.{name}"] = shape
    shapes["model.norm.weight"] = (c["hidden_size"],)
    if not c.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (c["vocab_size"], c["hidden_size"])
    return shapes


def preset_specs(config: dict[str, Any]) -> list[tuple[str, Shape, str]]:
    """(name, shape, dtype name) of every tensor a preset of ``config`` generates: all in
    its ``torch_dtype``."""
    dtype = config.get("torch_dtype", "float32")
    return [(name, shape, dtype) for name, shape in expected_shapes(config).items()]


def count_parameters(config: dict[str, Any]) -> int:
    total = 0
    for shape in expected_shapes(config).values():
        n = 1
        for dim in shape:
            n *= dim
        total += n
    return total
