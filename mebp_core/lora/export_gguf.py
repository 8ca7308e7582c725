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
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import torch

from mebp_core.atomic import staged_file
from mebp_core.gguf_layout import (
    GGUFLayoutError,
    gguf_architecture,
    gguf_tensor_name,
    to_llama_cpp_rows,
)
from mebp_core.lora.peft_files import AdapterError
from mebp_core.lora.peft_io import Adapters
from mebp_core.lora.spec import LoraSpec


def iter_gguf_tensors(
    adapters: Adapters, arch: gguf.MODEL_ARCH, config: dict
) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, f32 array) pairs, ``lora_a`` (r, in) then ``lora_b`` (out, r)."""
    name_map = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    for path, (lora_a, lora_b) in adapters.items():
        name = gguf_tensor_name(name_map, path)
        lora_b = to_llama_cpp_rows(path, lora_b, arch, config)
        yield name + ".lora_a", lora_a.to(torch.float32).contiguous().numpy()
        yield name + ".lora_b", lora_b.to(torch.float32).contiguous().numpy()


def gguf_alpha(spec: LoraSpec) -> float:
    """The alpha for which llama.cpp's ``alpha / r`` equals PEFT's scaling."""
    return spec.alpha * math.sqrt(spec.rank) if spec.use_rslora else spec.alpha


def write_gguf_adapter(out: Path, spec: LoraSpec, adapters: Adapters, config: dict) -> Path:
    """Write the GGUF file ``out``; an existing one is replaced only once complete.

    ``config`` is the base model's full HF text config (``model_type``, head counts, layers).
    """
    try:
        arch = gguf_architecture(config["model_type"])
        tensors = list(iter_gguf_tensors(adapters, arch, config))
    except GGUFLayoutError as exc:
        raise AdapterError(str(exc)) from None
    with staged_file(out) as staging:
        write_gguf_file(staging, arch, gguf_alpha(spec), tensors)
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
