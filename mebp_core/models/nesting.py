"""Where a checkpoint's config keeps its text model's: a module of its own, importing nothing,
so that the planner reads configs as the engine does without the package's type hints
(which name torch)."""

from __future__ import annotations

from typing import Any


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config. Multimodal Gemma 3 checkpoints nest it under text_config, and
    their head is tied as the outer config says (transformers' ``Gemma3Config``, whose
    ``tie_word_embeddings`` the model's tying reads: true unless it says otherwise)."""
    if config.get("model_type") == "gemma3":
        return {**(config.get("text_config") or {}), "model_type": "gemma3_text",
                "tie_word_embeddings": config.get("tie_word_embeddings", True)}
    return config
