"""Where a checkpoint's config keeps its text model's. A module of its own, importing nothing:
the package's ``__init__`` is torch-free when run, but names torch for its type hints, which
the import contracts count, and the planner (which may not import torch) reads configs
through this function as the engine does."""

from __future__ import annotations

from typing import Any


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config. Multimodal Gemma 3 checkpoints nest it under text_config, and
    their head is tied as the outer config says (transformers' ``Gemma3Config``, whose
    ``tie_word_embeddings`` the model's tying reads: true unless it says otherwise; a null
    unties it)."""
    if config.get("model_type") == "gemma3":
        return {**(config.get("text_config") or {}), "model_type": "gemma3_text",
                "tie_word_embeddings": bool(config.get("tie_word_embeddings", True))}
    return config
