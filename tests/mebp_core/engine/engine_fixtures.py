"""Tiny transformers models of every family and random batches, shared by the engine tests."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from mebp_core.lora.spec import LoraSpec

_COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               rms_norm_eps=1e-6)


def family_configs() -> dict[str, transformers.PretrainedConfig]:
    return {
        "llama": transformers.LlamaConfig(
            **_COMMON, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "qwen2": transformers.Qwen2Config(**_COMMON, tie_word_embeddings=True),
        "qwen3": transformers.Qwen3Config(**_COMMON, head_dim=24, tie_word_embeddings=True),
        "gemma3_text": transformers.Gemma3TextConfig(
            **{**_COMMON, "num_hidden_layers": 4}, head_dim=16, sliding_window=8,
            query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"] * 2,
            tie_word_embeddings=True),
    }


FAMILIES = list(family_configs())


def save_tiny_model(family: str, directory: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = family_configs()[family]
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # norms start at 1 (or 0 for Gemma); randomize them to test them
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(directory)
    return directory


LORA = LoraSpec(rank=4, alpha=8.0, targets="all")


def load_with_random_lora(packed_dir, *, seed: int = 1, compute_dtype: str = "float32",
                          knobs=None):
    """An engine whose LoRA B is non-zero too, so every LoRA gradient is non-trivial."""
    from mebp_core.engine.model import load_engine_model

    engine = load_engine_model(packed_dir, lora_spec=LORA, seed=seed,
                               compute_dtype=compute_dtype, knobs=knobs)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in engine.lora.values():
            module.lora_B.weight.copy_(torch.randn(module.lora_B.weight.shape, generator=gen))
            module.lora_B.weight.mul_(0.1)
    return engine


def random_batch(vocab_size: int, seed: int, batch: int = 2, seq_len: int = 20):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (batch, seq_len), generator=gen)
    labels = input_ids.clone()
    labels[0, :5] = -100  # a masked prompt
    labels[1, -3:] = -100  # right padding
    return input_ids, labels
