"""llama.cpp's quantized blocks of 32 weights along a row, made from the packed store.

q4_1 is ``w = d * q + m`` per block, q unsigned 4-bit, d and m float16: the store's int4
groups in the same affine form. A group of ``group_size`` (a multiple of 32) is
``group_size / 32`` blocks sharing its scale (d) and bias (m), which the store keeps as float16
already, so the blocks hold the packed weights exactly and llama.cpp dequantizes them, in
float32, to the engine's weights bit for bit. q8_0 (``w = d * q``, q signed 8-bit, d float16
per block of 32) has no offset: it is made from the dequantized weights by gguf's own
quantizer, bit for bit ggml's, and approximates them (BENCHMARKS.md measures how closely).
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

from mebp_core.store.gguf_sizes import BLOCK_SIZE, BLOCK_TYPES
from mebp_core.store.quant import unpack_int4
from mebp_core.store.reader import RawTensor


def q4_1_blocks(raw: RawTensor, group_size: int) -> torch.Tensor:
    """(N, K/32 * 20) uint8: per block its float16 d and m, then 16 bytes whose low nibbles
    are the block's first 16 weights and high nibbles its last 16 (ggml's block_q4_1)."""
    if raw.bits != 4 or group_size % BLOCK_SIZE:
        raise ValueError(f"q4_1 blocks come from int4 groups of a multiple of {BLOCK_SIZE}")
    n_rows = raw.data.shape[0]
    q = unpack_int4(raw.data).view(n_rows, -1, 2, BLOCK_SIZE // 2)  # (N, K/32, 2, 16)
    qs = q[:, :, 0] | (q[:, :, 1] << 4)  # (N, K/32, 16)
    per_group = group_size // BLOCK_SIZE

    def factor(t: torch.Tensor) -> torch.Tensor:  # (N, K/g) float16 -> (N, K/32, 2) bytes
        return t.repeat_interleave(per_group, dim=1).contiguous().view(torch.uint8) \
            .view(n_rows, -1, 2)
    return torch.cat([factor(raw.scales), factor(raw.biases), qs], dim=2).view(n_rows, -1)


def q8_0_blocks(weight: torch.Tensor) -> np.ndarray:
    """(N, K/32 * 34) uint8 of the float32 (N, K) ``weight``, as ggml quantizes it."""
    return gguf.quants.quantize(weight.numpy(), BLOCK_TYPES["q8_0"])

