"""PEFT's default LoRA init (``init_lora_weights=True``), seeded per module path.

A is ``kaiming_uniform_(a=sqrt(5))`` (the nn.Linear default, bound ``1/sqrt(in)``) and B is
zero, exactly as PEFT does. Each module draws from its own generator seeded by
``(seed, path)``, so the values do not depend on the order modules are visited.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn


def derive_module_seed(seed: int, path: str) -> int:
    """A 63-bit seed from the run seed and the module path (stable across processes)."""
    digest = hashlib.sha256(f"{seed}:{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_lora_weights(
    rank: int, in_features: int, out_features: int, *, seed: int, path: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return float32 ``(A, B)`` with A (r, in) kaiming-uniform and B (out, r) zero."""
    generator = torch.Generator().manual_seed(derive_module_seed(seed, path))
    lora_a = torch.empty(rank, in_features, dtype=torch.float32)  # (r, in)
    nn.init.kaiming_uniform_(lora_a, a=math.sqrt(5), generator=generator)
    lora_b = torch.zeros(out_features, rank, dtype=torch.float32)  # (out, r)
    return lora_a, lora_b


def compute_init_bound(in_features: int) -> float:
    """The half-width of A's uniform init: gain(a=sqrt(5)) * sqrt(3 / in) = 1 / sqrt(in)."""
    gain = nn.init.calculate_gain("leaky_relu", math.sqrt(5))
    return gain * math.sqrt(3.0 / in_features)
