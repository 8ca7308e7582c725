"""Tiny model configs and checkpoints for the store's tests (nothing comes from a hub)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from mebp_core.engine.mebp import compute_logits
from mebp_core.engine.model import load_engine_model
from mebp_core.lora.spec import LoraSpec

TINY_CONFIGS = {
    "llama": {"model_type": "llama", "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": False},
    "gemma3_text": {"model_type": "gemma3_text", "head_dim": 16, "query_pre_attn_scalar": 16},
}


def tiny_config(model_type: str, **overrides) -> dict:
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 96,
        "max_position_embeddings": 128,
        **TINY_CONFIGS[model_type],
        **overrides,
    }


LORA = LoraSpec(rank=4, alpha=8.0, targets="all")
VOCAB = 320  # room for the byte tokenizer's 259 ids


def save_text_model(out, model_type: str, **overrides):
    torch.manual_seed(0)
    config = AutoConfig.for_model(**tiny_config(model_type, vocab_size=VOCAB, **overrides))
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # zero-initialised norms and biases would hide a misplaced tensor
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.copy_(torch.randn_like(param) * 0.1 + (0 if "bias" in name else 1))
    model.save_pretrained(out)
    return out


def trained_engine(packed, seed: int = 1):
    """The engine with every LoRA B non-zero, as after training."""
    engine = load_engine_model(packed, lora_spec=LORA, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in engine.lora.values():
            weight = module.lora_B.weight
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.1)
    return engine


def trained_adapter_logits(packed, input_ids: torch.Tensor, adapter_dir) -> torch.Tensor:
    """The logits of ``trained_engine(packed)`` on ``input_ids``, its adapter saved to
    ``adapter_dir`` (PEFT's format) and the engine closed."""
    engine = trained_engine(packed)
    logits = compute_logits(engine, input_ids)
    engine.save_adapter(adapter_dir)
    engine.close()
    return logits
