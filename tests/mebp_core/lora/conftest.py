"""Tiny transformers models (random weights, saved and loaded back) for the LoRA tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)
FAMILIES = {"llama": LlamaConfig, "qwen2": Qwen2Config}


def save_tiny_model(family: str, directory: Path) -> Path:
    config = FAMILIES[family](**TINY_SHAPE)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def tiny_model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A saved tiny model of each family (Llama, Qwen2), shared by the session."""
    return save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="session")
def load_tiny_model() -> Callable[[Path], torch.nn.Module]:
    """Load a fresh float32 copy of a saved tiny model in eval mode."""

    def load(directory: Path) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        return model.eval()

    return load


@pytest.fixture
def token_batch() -> dict[str, torch.Tensor]:
    """A fixed (2, 12) batch of token ids with next-token labels."""
    generator = torch.Generator().manual_seed(123)
    input_ids = torch.randint(0, TINY_SHAPE["vocab_size"], (2, 12), generator=generator)
    return {"input_ids": input_ids, "labels": input_ids.clone()}


def randomize_lora_b(adapters: dict, seed: int = 7) -> None:
    """Give every B non-zero values so the adapter changes the output."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in adapters.values():
            weight = module.lora_B.weight
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.1)


@pytest.fixture(scope="session")
def set_nonzero_b() -> Callable[..., None]:
    return randomize_lora_b
