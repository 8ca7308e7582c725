"""The bytes of a base export's weights, predicted from the model's tensor shapes before
anything is packed or exported. Exact for the weights; the file adds its metadata (config,
tokenizer, GGUF header and alignment, zip entries): a few KB to a few hundred KB."""

from __future__ import annotations

import math
from pathlib import Path

from mebp_core.store.checkpoint import CheckpointSource
from mebp_core.store.format import ITEMSIZES, QUANT_BITS
from mebp_core.store.gguf_sizes import blocks_nbytes
from mebp_core.store.groups import choose_bits
from mebp_core.store.preset_configs import PRESET_PREFIX, preset_config
from mebp_core.store.shapes import preset_specs

# (name, shape, the source's dtype name) per tensor the packer stores
Specs = list[tuple[str, tuple[int, ...], str]]


def source_specs(source: str) -> Specs:
    """The tensors ``source`` (``preset:NAME`` or a Hugging Face directory) packs into, read
    from its config or safetensors headers: no weight is read."""
    if source.startswith(PRESET_PREFIX):
        return preset_specs(preset_config(source.removeprefix(PRESET_PREFIX)))
    opened = CheckpointSource(Path(source))
    try:
        return opened.specs
    finally:
        opened.close()


def export_weight_bytes(specs: Specs, *, quant: str, group_size: int, fmt: str, dtype: str,
                        gguf_quant: str | None = None) -> int:
    """The bytes of the weights in the export of a store packed ``quant`` / ``group_size``."""
    total = 0
    for _, shape, source_dtype in specs:
        bits = choose_bits(shape, source_dtype, QUANT_BITS[quant], group_size)
        elements = math.prod(shape)
        if fmt == "hf":
            total += elements * ITEMSIZES[dtype]
        elif fmt == "mlx":
            total += (elements * ITEMSIZES[source_dtype] if bits is None else
                      elements * bits // 8 + 2 * elements // group_size * ITEMSIZES[dtype])
        elif gguf_quant is not None and bits is not None:
            total += blocks_nbytes(shape, gguf_quant)
        else:  # gguf: 2-D weights in dtype, the rest float32
            total += elements * (ITEMSIZES[dtype] if len(shape) == 2 and gguf_quant is None
                                 else 4)
    return total

