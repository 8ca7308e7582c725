"""The base model as MLX quantized weights, the packed arrays as they are.

mebp's affine groups are MLX's: ``w = scale * q + bias`` per group along the input dim, q
unsigned, packed least significant bits first (int4: the even column in the low nibble), so
a row of packed bytes read as little-endian uint32 is MLX's ``quantize`` layout. The packed
scales and biases are float16; MLX dequantizes in the factors' dtype, so they are written as
float32 (holding the float16 values exactly) and ``scale * q + bias`` rounds once, in
float32, as the engine's dequantization does: the weights equal the engine's bit for bit.
``dtype="float16"`` keeps the factors as packed (a smaller file) and MLX then rounds each
weight to float16. Tensors the packer keeps unquantized (norms, biases) are written as kept.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch

from mebp_core.store.dtypes import DTYPES
from mebp_core.store.export_base_checks import MLX_BITS, check_mlx_base
from mebp_core.store.export_base_common import BaseExportError, Progress
from mebp_core.store.reader import PackedStore


def mlx_config(store: PackedStore) -> dict[str, Any]:
    bits = MLX_BITS[store.quant]
    quantization = {"group_size": store.group_size, "bits": bits, "mode": "affine"}
    config = {**store.config, "quantization": quantization,
              "quantization_config": quantization}
    # mlx-lm 0.32 reads a top-level rope_theta only; transformers 5 nests it
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    return config


def mlx_tensors(store: PackedStore, dtype: str,
                progress: Progress | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """MLX's tensors in store order: ``X.weight`` (N, K*bits/32) uint32 with ``X.scales`` and
    ``X.biases`` (N, K/group_size) for a packed weight; the kept tensor otherwise."""
    if sys.byteorder != "little":  # the uint32 view below reads the bytes little-endian
        raise BaseExportError("MLX export needs a little-endian host")
    check_mlx_base(dtype, store.quant, store.group_size)
    factor_dtype = DTYPES[dtype]
    names = store.names()
    for i, name in enumerate(names):
        raw = store.raw(name)
        if raw.bits is None:
            yield name, raw.data
        else:
            stem = name.removesuffix(".weight")
            yield name, raw.data.view(torch.uint32)  # (N, K*bits/8) bytes -> (N, K*bits/32)
            yield stem + ".scales", raw.scales.to(factor_dtype)
            yield stem + ".biases", raw.biases.to(factor_dtype)
        if progress is not None:
            progress(i + 1, len(names), name)

