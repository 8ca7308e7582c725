"""Architectures, one file per Hugging Face ``model_type``; the filename is the registry.

Each architecture file is math only (no quantization, I/O or memory logic) and defines
``ModelArgs``, ``Attention``, ``MLP``, ``TransformerBlock`` and ``Model`` with Hugging Face's
module names kept verbatim, so ``Model.named_modules()`` yields the same paths as the
transformers ``*ForCausalLM`` model (``model.layers.0.self_attn.q_proj``...). That is what
lets the engine swap frozen projections for lazily decompressed ones by path and lets LoRA
adapters round-trip through PEFT without key maps.

The engine relies on this contract of ``Model``:

- ``Model(args)`` builds cheaply under ``torch.device("meta")``;
- ``embed(input_ids) -> h`` with ``h`` of shape (B, T, D), any embedding scale included;
- ``make_context(seq_len, device, dtype, matmul_dtype=None) -> BlockContext``: rotary
  tables and masks for every layer type, computed once per sequence length, and the dtype
  attention runs in (``mebp_core.models.base``);
- ``model.layers[i](h, ctx) -> h``: one transformer block;
- ``final_norm(h) -> h``;
- ``head_weight_name``: the HF tensor name of the output projection (the embedding when tied);
- ``logit_softcap``: None, or c for logits = c * tanh(logits / c) (Gemma 3);
- ``args``: the frozen ``ModelArgs`` (``hidden_size``, ``num_hidden_layers``, ``vocab_size``,
  ``head_dim``, ``layer_types``, ``tie_word_embeddings``...);
- ``forward(input_ids) -> logits``: the plain reference forward.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mebp_core.errors import MebpError
from mebp_core.models.nesting import text_config

if TYPE_CHECKING:  # the package itself is torch-free: the API reads configs through it
    from torch import nn

# model_type -> module name under mebp_core.models
_ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3_text",
    "gemma3": "gemma3_text",
}


class UnknownArchitectureError(MebpError, ValueError):
    """The config names a model_type this engine does not implement."""


def architecture_module(config: dict[str, Any]):
    model_type = text_config(config).get("model_type")
    if model_type not in _ARCHITECTURES:
        known = ", ".join(sorted(_ARCHITECTURES))
        raise UnknownArchitectureError(
            f"config.json: model_type {model_type!r} is not supported (known: {known})"
        )
    return importlib.import_module(f"mebp_core.models.{_ARCHITECTURES[model_type]}")


def build_model(config: dict[str, Any]) -> nn.Module:
    """Build the architecture for a Hugging Face config dict (weights left uninitialized)."""
    module = architecture_module(config)
    args = module.ModelArgs.from_hf_config(text_config(config))
    return module.Model(args)
