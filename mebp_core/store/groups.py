"""Quantization groups: weights per group (with their own scale and bias) are a power of two
from 8 to 4096, as every deployment format's are (MLX 32/64/128, GGUF 32); that also bounds a
model's distinct packings. Torch-free: the training config validates with it."""

from __future__ import annotations

MIN_GROUP_SIZE, MAX_GROUP_SIZE = 8, 4096


def check_group_size(group_size: int) -> int:
    """``group_size``, or a ``ValueError`` saying what a group size must be."""
    if not MIN_GROUP_SIZE <= group_size <= MAX_GROUP_SIZE or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two from {MIN_GROUP_SIZE} to "
                         f"{MAX_GROUP_SIZE}, got {group_size}")
    return group_size


def is_quantizable(shape: tuple[int, ...], group_size: int) -> bool:
    return len(shape) == 2 and shape[1] % group_size == 0 and group_size % 2 == 0


def choose_bits(shape: tuple[int, ...], dtype: str, bits: int | None,
                group_size: int) -> int | None:
    """Quantize 2-D float weights whose input dim splits into groups; keep the rest as is."""
    floating = dtype in ("float32", "float16", "bfloat16", "float64")
    if bits is None or not floating or not is_quantizable(shape, group_size):
        return None
    return bits
