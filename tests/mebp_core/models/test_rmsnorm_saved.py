"""An RMSNorm over 16-bit activations keeps its input for backward, not the float32 copy it
normalizes: the same gradients bit for bit, half the bytes the kernel counts."""

from __future__ import annotations

import contextlib

import pytest
import torch

from mebp_core.kernel_memory import read_memory
from mebp_core.models import base
from mebp_core.models.base import RMSNorm
from mebp_core.units import MB


def norm_and_grad(x: torch.Tensor, grad_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    norm = RMSNorm(x.shape[-1]).to(x.dtype).requires_grad_(False)  # frozen, as in the engine
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, x.shape[-1]))
    x = x.detach().requires_grad_(True)
    y = norm(x)
    y.backward(grad_y)
    return y.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gradients_are_those_of_the_float32_copy_kept_bit_for_bit(dtype, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 37, 96, generator=gen) * 4).to(dtype)
    grad_y = torch.randn(3, 37, 96, generator=gen).to(dtype)
    y, grad = norm_and_grad(x, grad_y)
    monkeypatch.setattr(base, "upcast_kept_as_input", lambda *_: contextlib.nullcontext())
    y_kept, grad_kept = norm_and_grad(x, grad_y)
    assert torch.equal(y, y_kept)
    assert torch.equal(grad.view(torch.int16), grad_kept.view(torch.int16))


def test_the_graph_holds_the_16_bit_input_not_its_float32_copy():
    """A (4096, 4096) bfloat16 input is 32 MB and its float32 copy 64 MB: after the forward
    the process holds the output (32 MB) and no copy."""
    x = torch.randn(4096, 4096).to(torch.bfloat16).requires_grad_(True)
    norm = RMSNorm(4096).to(torch.bfloat16).requires_grad_(False)
    before = read_memory().charged_bytes
    y = norm(x)
    held = read_memory().charged_bytes - before
    assert 28 * MB < held < 48 * MB, held / MB
    y.sum().backward()
    assert torch.isfinite(x.grad.float()).all()
