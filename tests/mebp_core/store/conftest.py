"""Tiny Hugging Face checkpoints built from configs (nothing comes from a hub)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import tiny_config


def save_tiny_model(
    out: Path, model_type: str, sharded: bool = False, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Save a seeded tiny model to ``out``; returns its state dict (tied head left out)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_config(model_type)))
    model = model.to(dtype)
    with torch.no_grad():  # transformers zero-inits some norms and biases: make them visible
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (0 if "bias" in name else 1))
    model.save_pretrained(out, max_shard_size="60KB" if sharded else "1GB")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """Cache of saved tiny models keyed by (model_type, sharded, dtype)."""
    cache: dict = {}

    def get(model_type: str, sharded: bool = False, dtype: torch.dtype = torch.float32):
        key = (model_type, sharded, dtype)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{model_type}-{'sharded' if sharded else 'single'}")
            cache[key] = (out, save_tiny_model(out, model_type, sharded, dtype))
        return cache[key]

    return get


def rss_anon_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


@pytest.fixture
def store_helpers():
    """Helpers for tests (conftest modules are not importable by name)."""

    class Helpers:
        tiny_config = staticmethod(tiny_config)
        save_tiny_model = staticmethod(save_tiny_model)
        rss_anon_kb = staticmethod(rss_anon_kb)

    return Helpers
