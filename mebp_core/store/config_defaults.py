"""transformers' defaults for the config fields a model's tensor shapes need (and the planner's
view of its architecture), kept here so a config is read without transformers, whose
``AutoConfig`` imports torch (the API lists a model's base exports by their shapes).
tests/mebp_core/store/test_shapes.py holds them equal to transformers' own."""

from __future__ import annotations

from typing import Any

from mebp_core.errors import MebpError

# per model_type, the fields' defaults where a config omits them; num_key_value_heads None
# (a default, or null in the config) is the attention heads, head_dim None hidden_size / heads
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                  num_key_value_heads=None, head_dim=None, num_hidden_layers=32,
                  vocab_size=32000, tie_word_embeddings=False),
    "qwen2": dict(hidden_size=4096, intermediate_size=22016, num_attention_heads=32,
                  num_key_value_heads=32, head_dim=None, num_hidden_layers=32,
                  vocab_size=151936, tie_word_embeddings=False),
    "qwen3": dict(hidden_size=4096, intermediate_size=22016, num_attention_heads=32,
                  num_key_value_heads=32, head_dim=128, num_hidden_layers=32,
                  vocab_size=151936, tie_word_embeddings=False),
    "gemma3_text": dict(hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                        num_key_value_heads=4, head_dim=256, num_hidden_layers=26,
                        vocab_size=262208, tie_word_embeddings=True),
}
SUPPORTED_MODEL_TYPES = tuple(sorted(DEFAULTS))


class UnsupportedModelTypeError(MebpError, ValueError):
    """The config names a model_type mebp does not implement."""


def supported_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: multimodal Gemma 3's nested one (as ``models.text_config``
    reads it), tied as the outer config says where it does; or an
    ``UnsupportedModelTypeError``."""
    text = config
    if config.get("model_type") == "gemma3":
        text = {**config.get("text_config", {}), "model_type": "gemma3_text"}
        if "tie_word_embeddings" in config:
            text["tie_word_embeddings"] = config["tie_word_embeddings"]
    if text.get("model_type") not in DEFAULTS:
        raise UnsupportedModelTypeError(
            f"config.json: model_type {config.get('model_type')!r} is not supported "
            f"(known: {', '.join(SUPPORTED_MODEL_TYPES)}, gemma3)")
    return text


def with_defaults(text: dict[str, Any]) -> dict[str, Any]:
    """The text config ``text`` (of a supported model_type) with every field of ``DEFAULTS``
    filled in, the heads and head size resolved."""
    filled = {**DEFAULTS[text["model_type"]], **text}
    filled["num_key_value_heads"] = (filled["num_key_value_heads"]
                                     or filled["num_attention_heads"])
    filled["head_dim"] = filled["head_dim"] or filled["hidden_size"] // filled[
        "num_attention_heads"]
    return filled
