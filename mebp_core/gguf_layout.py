"""How llama.cpp lays out a Hugging Face model: its architecture, its tensor names (from
gguf's own HF-to-GGUF map) and the row order of q/k projections, shared by the adapter and
the base model exports."""

from __future__ import annotations

from typing import TYPE_CHECKING

import gguf

from mebp_core.errors import MebpError

if TYPE_CHECKING:
    import torch


class GGUFLayoutError(MebpError, ValueError):
    """A model or module llama.cpp has no layout for."""


# HF model_type -> llama.cpp architecture (what its HF converter picks for these models).
GGUF_ARCHITECTURES: dict[str, gguf.MODEL_ARCH] = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
    "gemma3": gguf.MODEL_ARCH.GEMMA3,
}


def gguf_architecture(model_type: str) -> gguf.MODEL_ARCH:
    try:
        return GGUF_ARCHITECTURES[model_type]
    except KeyError:
        known = ", ".join(GGUF_ARCHITECTURES)
        message = f"no GGUF architecture for model_type {model_type!r} (known: {known})"
        raise GGUFLayoutError(message) from None


def gguf_tensor_name(name_map: gguf.TensorNameMap, path: str) -> str:
    """``model.layers.0.self_attn.q_proj`` -> ``blk.0.attn_q.weight``."""
    name = name_map.get_name(path + ".weight", try_suffixes=(".weight",))
    if name is None:
        raise GGUFLayoutError(f"module {path} has no GGUF tensor name for this architecture")
    return name


def unpermute_rows(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute`` on the rows (output features) of a weight, bias or
    LoRA B: HF's rotate-half q/k layout back to the interleaved one llama.cpp ropes with."""
    shape = rows.shape
    return (
        rows.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def to_llama_cpp_rows(
    path: str, rows: torch.Tensor, arch: gguf.MODEL_ARCH, config: dict
) -> torch.Tensor:
    """``rows`` of module ``path`` as llama.cpp needs them: q/k un-permuted for the llama
    architecture only."""
    if arch != gguf.MODEL_ARCH.LLAMA:
        return rows
    heads = config["num_attention_heads"]
    if path.endswith("q_proj"):
        return unpermute_rows(rows, heads)
    if path.endswith("k_proj"):
        return unpermute_rows(rows, config.get("num_key_value_heads") or heads)
    return rows
