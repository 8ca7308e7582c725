"""The tensor names and shapes a config implies, in Hugging Face ``*ForCausalLM`` naming.

Packing checks a checkpoint against this, presets generate exactly these tensors, and
parameter counts come from it without materializing anything: from the config with
transformers' defaults for the fields they need (``config_defaults``), without transformers.
"""

from __future__ import annotations

from typing import Any

from mebp_core.models import UnknownArchitectureError
from mebp_core.store.config_defaults import (
    BIAS_FLAGS,
    UnsupportedModelTypeError,
    supported_text_config,
    with_defaults,
)

Shape = tuple[int, ...]


def full_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text config with transformers' defaults filled in (hub configs omit defaults)."""
    from transformers import AutoConfig  # which imports torch

    return AutoConfig.for_model(**_supported_text_config(config)).to_dict()


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
        if "mlp_bias" in BIAS_FLAGS[model_type] and c.get("mlp_bias"):
            shapes[f"mlp.{proj}.bias"] = (shape[0],)
    return shapes


def shape_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config with transformers' defaults for the fields its shapes need."""
    return with_defaults(_supported_text_config(config))


def expected_shapes(config: dict[str, Any]) -> dict[str, Shape]:
    """Every tensor of the text model, in checkpoint order: embeddings, layers, norm, head."""
    return tensor_shapes(shape_config(config))


def tensor_shapes(c: dict[str, Any]) -> dict[str, Shape]:
    """The tensors of a text config whose fields are filled in (``shape_config``, or
    transformers' full config)."""
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


def _supported_text_config(config: dict[str, Any]) -> dict[str, Any]:
    try:
        return supported_text_config(config)
    except UnsupportedModelTypeError as exc:
        raise UnknownArchitectureError(str(exc)) from None
