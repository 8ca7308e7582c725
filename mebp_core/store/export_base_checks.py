"""Whether a base export can be written, from the model's config and the storage asked for,
before anything is packed or exported. Torch-free: the API refuses a download, and lists a
model's formats, without loading torch."""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np

from mebp_core.gguf_layout import GGUFLayoutError, gguf_architecture
from mebp_core.models import text_config
from mebp_core.store.export_base_common import (
    BASE_DTYPES,
    BASE_FORMATS,
    GGUF_QUANTS,
    BaseExportError,
)
from mebp_core.store.gguf_sizes import BLOCK_SIZE

GGUF_BASE_ARCHITECTURES = (gguf.MODEL_ARCH.LLAMA, gguf.MODEL_ARCH.QWEN2, gguf.MODEL_ARCH.QWEN3)
GGUF_DTYPES = {"float32": (np.float32, gguf.LlamaFileType.ALL_F32),
               "float16": (np.float16, gguf.LlamaFileType.MOSTLY_F16)}
# the stores each block type is made from: q4_1 carries int4 groups as they are
GGUF_QUANT_STORES = {"q4_1": ("int4",), "q8_0": ("int4", "int8")}
MLX_GROUP_SIZES = (32, 64, 128)  # what mlx's quantize supports
MLX_BITS = {"int4": 4, "int8": 8}
MLX_FACTOR_DTYPES = ("float32", "float16")  # an MLX base's scales and biases


def check_base_format(config: dict, fmt: str, dtype: str, *, quant: str | None = None,
                      group_size: int | None = None, gguf_quant: str | None = None) -> None:
    """Refuse, from the model's config and the storage asked for (``quant``, ``group_size``,
    when known), an export that cannot be written."""
    if fmt not in BASE_FORMATS:
        raise BaseExportError(f"unknown base format {fmt!r} (known: {', '.join(BASE_FORMATS)})")
    if dtype not in BASE_DTYPES:
        raise BaseExportError(f"unknown dtype {dtype!r} (known: {', '.join(BASE_DTYPES)})",
                              "dtype")
    if gguf_quant is not None and gguf_quant not in GGUF_QUANTS:
        raise BaseExportError(f"unknown GGUF block type {gguf_quant!r} "
                              f"(known: {', '.join(GGUF_QUANTS)})", "quant")
    if gguf_quant is not None and fmt != "gguf":
        raise BaseExportError(f"{gguf_quant} is a GGUF block type; format {fmt} has none",
                              "quant")
    if fmt == "gguf":
        check_gguf_base(config, dtype, gguf_quant, quant, group_size)
    elif fmt == "mlx":
        check_mlx_base(dtype, quant, group_size)


def check_gguf_base(config: dict[str, Any], dtype: str, gguf_quant: str | None = None,
                    quant: str | None = None, group_size: int | None = None) -> gguf.MODEL_ARCH:
    """The architecture to write ``config``'s model as, or a ``BaseExportError``; the
    storage (``quant``, ``group_size``) is checked where known."""
    arch = base_architecture(text_config(config).get("model_type"))
    if dtype not in GGUF_DTYPES:
        raise BaseExportError(f"GGUF bases are written as {' or '.join(GGUF_DTYPES)}, "
                              f"not {dtype}", "dtype")
    if gguf_quant is None:
        return arch
    if dtype != "float32":
        raise BaseExportError(f"a {gguf_quant} GGUF keeps its unquantized tensors float32, "
                              f"not {dtype}", "dtype")
    stores = GGUF_QUANT_STORES[gguf_quant]
    if quant is not None and quant not in stores:
        raise BaseExportError(f"{gguf_quant} blocks are made from a store packed "
                              f"{' or '.join(stores)}, not {quant}", "quant")
    if group_size is not None and group_size % BLOCK_SIZE:
        raise BaseExportError(f"{gguf_quant} blocks of {BLOCK_SIZE} need groups of a multiple "
                              f"of {BLOCK_SIZE}, not {group_size}", "group_size")
    return arch


def base_architecture(model_type: str) -> gguf.MODEL_ARCH:
    try:
        arch = gguf_architecture(model_type)
    except GGUFLayoutError as exc:
        raise BaseExportError(str(exc)) from None
    if arch not in GGUF_BASE_ARCHITECTURES:
        known = ", ".join(gguf.MODEL_ARCH_NAMES[a] for a in GGUF_BASE_ARCHITECTURES)
        raise BaseExportError(f"GGUF base export covers {known}; for {model_type} export hf "
                              "and convert it with llama.cpp's convert_hf_to_gguf.py")
    return arch


def check_mlx_base(dtype: str, quant: str | None = None, group_size: int | None = None) -> None:
    """Refuse what MLX cannot hold: the factors' dtype, and (when known) the storage."""
    if dtype not in MLX_FACTOR_DTYPES:
        raise BaseExportError(f"MLX bases keep their scales as {' or '.join(MLX_FACTOR_DTYPES)}"
                              f" (float32: exact), not {dtype}", "dtype")
    if quant is not None and quant not in MLX_BITS:
        raise BaseExportError(f"an MLX base is the packed {' or '.join(MLX_BITS)} weights; a "
                              f"model stored {quant} has none: export hf, which mlx_lm loads",
                              "quant")
    if group_size is not None and group_size not in MLX_GROUP_SIZES:
        raise BaseExportError(f"MLX quantizes in groups of {MLX_GROUP_SIZES}, not {group_size}",
                              "group_size")
