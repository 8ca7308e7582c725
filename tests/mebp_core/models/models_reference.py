"""Reference cases: tiny random transformers models, saved, and our models loaded from them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from mebp_core.models import build_model

SEQ_LEN = 12
BATCH = 2
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
}
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
# name -> (model_type, config kwargs); each family appears tied and untied somewhere
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {"num_hidden_layers": 2}),
    "llama3_rope_tied": (
        "llama",
        {
            "num_hidden_layers": 2,
            "rope_theta": 500_000.0,
            "rope_scaling": LLAMA3_SCALING,
            "tie_word_embeddings": True,
        },
    ),
    "qwen2_tied": ("qwen2", {"num_hidden_layers": 2, "tie_word_embeddings": True}),
    "qwen2_sliding": (
        "qwen2",
        {
            "num_hidden_layers": 2,
            "use_sliding_window": True,
            "sliding_window": 4,
            "max_window_layers": 1,
        },
    ),
    "qwen3": ("qwen3", {"num_hidden_layers": 2, "head_dim": 32, "rope_theta": 1_000_000.0}),
    "gemma3_sliding_tied": (
        "gemma3_text",
        {
            "num_hidden_layers": 4,
            "head_dim": 16,
            "sliding_window": 4,
            "sliding_window_pattern": 3,
            "query_pre_attn_scalar": 24,
            "final_logit_softcapping": 2.0,
        },
    ),
    "gemma3_linear_rope": (
        "gemma3_text",
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "sliding_window": 5,
            "layer_types": ["sliding_attention", "full_attention", "full_attention"],
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "tie_word_embeddings": False,
        },
    ),
}


@dataclass
class SavedModel:
    name: str
    hf: nn.Module
    path: Path

    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text())


def make_hf_model(model_type: str, kwargs: dict[str, Any]) -> nn.Module:
    """A random float32 transformers model whose norms and biases are not at their init."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**TINY, **kwargs})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(0.2 * torch.randn_like(param))
    return model


def load_dense_weights(model: nn.Module, path: Path) -> nn.Module:
    """Load every safetensors shard by HF name into a (possibly meta) model."""
    state = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(shard))
    model.load_state_dict(state, strict=True, assign=True)
    return model


def load_ours(config: dict[str, Any], path: Path) -> nn.Module:
    with torch.device("meta"):
        model = build_model(config)
    return load_dense_weights(model, path).eval()


def make_input_ids(vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab_size, (BATCH, SEQ_LEN), generator=generator)  # (B, T)


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """max|ours - reference| / max|reference|, in float64."""
    ours, reference = ours.double(), reference.double()
    return ((ours - reference).abs().max() / reference.abs().max()).item()


def to_v4_config(config: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a 5.x config.json in the 4.x style of hub files (rope_theta, rope_scaling...)."""
    config = dict(config)
    rope = config.pop("rope_parameters")
    if "full_attention" in rope:
        config["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
        rope = rope["full_attention"]
        layer_types = config.pop("layer_types")
        pattern = layer_types.index("full_attention") + 1
        config["sliding_window_pattern"] = pattern
        if layer_types != [
            "sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(len(layer_types))
        ]:
            config["layer_types"] = layer_types
    elif config["model_type"].startswith("qwen"):
        config.pop("layer_types")
    rope = dict(rope)
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    return config
