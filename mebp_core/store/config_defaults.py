"""transformers' defaults for the config fields a model's tensor shapes need (and the planner's
view of its architecture), kept here so a config is read without transformers, whose
``AutoConfig`` imports torch (the API lists a model's base exports by their shapes).
tests/mebp_core/store/test_shapes.py holds them equal to transformers' own."""

from __future__ import annotations

from typing import Any

from mebp_core.errors import MebpError
from mebp_core.models.nesting import text_config

# per model_type, the fields' defaults where a config omits them; num_key_value_heads None
# (a default, or a null NULLABLE allows) is the attention heads, head_dim None
# hidden_size / heads.
# Llama's and Qwen's sizes have none here: transformers would make a 7B model of a config
# without them, which the engine (models/*.py) refuses, so they are required.
REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
            "vocab_size")
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(num_key_value_heads=None, head_dim=None, tie_word_embeddings=False),
    "qwen2": dict(num_key_value_heads=32, head_dim=None, tie_word_embeddings=False),
    "qwen3": dict(num_key_value_heads=32, head_dim=128, tie_word_embeddings=False),
    "gemma3_text": dict(hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                        num_key_value_heads=4, head_dim=256, num_hidden_layers=26,
                        vocab_size=262208, tie_word_embeddings=True),
}
SUPPORTED_MODEL_TYPES = tuple(sorted(DEFAULTS))
# the bias flags each architecture's shapes read (Qwen2's biases are fixed by its design)
BIAS_FLAGS = {"llama": ("attention_bias", "mlp_bias"), "qwen2": (),
              "qwen3": ("attention_bias",), "gemma3_text": ("attention_bias",)}
# the fields whose null transformers takes (for a default); a null in any other field the
# shapes read it refuses, and so does this module, before packing would
NULLABLE = {"llama": ("num_key_value_heads", "head_dim"), "qwen2": ("num_key_value_heads",),
            "qwen3": ("num_key_value_heads",), "gemma3_text": ()}


class UnsupportedModelTypeError(MebpError, ValueError):
    """The config names a model_type mebp does not implement."""


class ConfigFieldError(MebpError, ValueError):
    """A field the model's shapes need is missing (and nothing defaults it) or is not a whole
    number."""


def supported_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config (``models.text_config``: multimodal Gemma 3's nested one), or
    an ``UnsupportedModelTypeError``."""
    text = text_config(config)
    if text.get("model_type") not in DEFAULTS:
        raise UnsupportedModelTypeError(
            f"config.json: model_type {config.get('model_type')!r} is not supported "
            f"(known: {', '.join(SUPPORTED_MODEL_TYPES)}, gemma3)")
    return text


def with_defaults(text: dict[str, Any]) -> dict[str, Any]:
    """The text config ``text`` (of a supported model_type) with every field of ``DEFAULTS``
    filled in, the heads and head size resolved; a ``ConfigFieldError`` naming a size
    it lacks or that is not a whole number."""
    model_type = text["model_type"]
    for field in (*REQUIRED, *DEFAULTS[model_type], *BIAS_FLAGS[model_type]):
        if field in text and text[field] is None and field not in NULLABLE[model_type]:
            raise ConfigFieldError(f"config.json: {field} must not be null for {model_type}")
    filled = {**DEFAULTS[model_type], **text}
    for field in REQUIRED:
        if field not in filled:
            raise ConfigFieldError(f"config.json: missing field {field!r}")
        value = filled[field]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigFieldError(f"config.json: {field} must be a whole number, got "
                                   f"{value!r}")
    filled["num_key_value_heads"] = (filled["num_key_value_heads"]
                                     or filled["num_attention_heads"])
    filled["head_dim"] = filled["head_dim"] or filled["hidden_size"] // filled[
        "num_attention_heads"]
    return filled
