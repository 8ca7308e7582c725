"""Write a LoRA adapter as a GGUF file for llama.cpp, as its ``convert_lora_to_gguf.py`` does.

Keys: ``general.architecture``, ``general.type = "adapter"``, ``adapter.type = "lora"``,
``adapter.lora.alpha``. Tensors (f32): ``blk.<i>.<gguf name>.weight.lora_a`` (r, in) and
``.lora_b`` (out, r) in numpy order, names from gguf's own HF-to-GGUF tensor map.
llama.cpp scales by ``alpha / r`` with r read from the tensors; for rsLoRA the alpha written
is ``alpha * sqrt(r)`` so the product is PEFT's ``alpha / sqrt(r)`` (the upstream converter
ignores ``use_rslora``).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import torch

from mebp_core.lora.peft_io import AdapterError, Adapters
from mebp_core.lora.spec import LoraSpec

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
        raise AdapterError(message) from None


def gguf_tensor_name(name_map: gguf.TensorNameMap, path: str) -> str:
    """``model.layers.0.self_attn.q_proj`` -> ``blk.0.attn_q.weight``."""
    name = name_map.get_name(path + ".weight", try_suffixes=(".weight",))
    if name is None:
        raise AdapterError(f"adapter module {path} has no GGUF tensor name for this architecture")
    return name


def unpermute_rows(lora_b: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute`` on B's rows: HF's rotate-half q/k layout back to
    the interleaved layout llama.cpp's llama architecture ropes with."""
    out_features, rank = lora_b.shape
    return (
        lora_b.reshape(n_head, 2, out_features // n_head // 2, rank)
        .swapaxes(1, 2)
        .reshape(out_features, rank)
    )


def convert_lora_b(
    path: str, lora_b: torch.Tensor, arch: gguf.MODEL_ARCH, config: dict
) -> torch.Tensor:
    """B as llama.cpp needs it: q/k rows un-permuted for the llama architecture only."""
    if arch != gguf.MODEL_ARCH.LLAMA:
        return lora_b
    heads = config["num_attention_heads"]
    if path.endswith("q_proj"):
        return unpermute_rows(lora_b, heads)
    if path.endswith("k_proj"):
        return unpermute_rows(lora_b, config.get("num_key_value_heads") or heads)
    return lora_b


def iter_gguf_tensors(
    adapters: Adapters, arch: gguf.MODEL_ARCH, config: dict
) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, f32 array) pairs, ``lora_a`` (r, in) then ``lora_b`` (out, r)."""
    name_map = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    for path, (lora_a, lora_b) in adapters.items():
        name = gguf_tensor_name(name_map, path)
        lora_b = convert_lora_b(path, lora_b, arch, config)
        yield name + ".lora_a", lora_a.to(torch.float32).contiguous().numpy()
        yield name + ".lora_b", lora_b.to(torch.float32).contiguous().numpy()


def gguf_alpha(spec: LoraSpec) -> float:
    """The alpha for which llama.cpp's ``alpha / r`` equals PEFT's scaling."""
    return spec.alpha * math.sqrt(spec.rank) if spec.use_rslora else spec.alpha


def write_gguf_adapter(out: Path, spec: LoraSpec, adapters: Adapters, config: dict) -> Path:
    """Write the GGUF file ``out``; an existing one is replaced only once complete.

    ``config`` is the base model's full HF text config (``model_type``, head counts, layers).
    """
    arch = gguf_architecture(config["model_type"])
    tensors = list(iter_gguf_tensors(adapters, arch, config))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, staging_name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    staging = Path(staging_name)
    try:
        write_gguf_file(staging, arch, gguf_alpha(spec), tensors)
        os.replace(staging, out)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return out


def write_gguf_file(
    path: Path, arch: gguf.MODEL_ARCH, alpha: float, tensors: list[tuple[str, np.ndarray]]
) -> None:
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    try:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for name, array in tensors:
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
