"""GGUF's block types and the bytes their blocks take (torch-free: the API predicts a base
export's size with them)."""

from __future__ import annotations

import gguf

BLOCK_SIZE = 32  # QK4_1 = QK8_0
BLOCK_TYPES = {"q4_1": gguf.GGMLQuantizationType.Q4_1, "q8_0": gguf.GGMLQuantizationType.Q8_0}


def blocks_nbytes(shape: tuple[int, ...], gguf_quant: str) -> int:
    block_size, block_nbytes = gguf.GGML_QUANT_SIZES[BLOCK_TYPES[gguf_quant]]
    return shape[0] * shape[1] // block_size * block_nbytes
