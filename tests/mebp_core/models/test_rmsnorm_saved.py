"""An RMSNorm over 16-bit activations keeps its input for backward, not the float32 copy it
normalizes: the same gradients bit for bit, half the bytes the kernel counts."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mebp_core.models import base, gemma3_text
from mebp_core.units import MB

NORMS = {"llama": base.RMSNorm, "gemma3": gemma3_text.RMSNorm}


def frozen_norm(kind: str, dim: int, dtype: torch.dtype) -> torch.nn.Module:
    norm = NORMS[kind](dim).to(dtype).requires_grad_(False)  # frozen, as in the engine
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-0.5, 1.5, dim))
    return norm


def norm_and_grad(kind: str, x: torch.Tensor, grad_y: torch.Tensor, transposed: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_(True)
    inputs = x.transpose(1, 2) if transposed else x  # a q/k norm reads a transposed view
    y = frozen_norm(kind, inputs.shape[-1], x.dtype)(inputs)
    y.backward(grad_y.transpose(1, 2) if transposed else grad_y)
    return y.detach(), x.grad


@pytest.mark.parametrize("kind", NORMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("transposed", [False, True])
def test_the_gradients_are_those_of_the_float32_copy_kept_bit_for_bit(kind, dtype, transposed,
                                                                      monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 96, 96, generator=gen) * 4).to(dtype)
    grad_y = torch.randn(3, 96, 96, generator=gen).to(dtype)
    y, grad = norm_and_grad(kind, x, grad_y, transposed)
    for module in (base, gemma3_text):
        monkeypatch.setattr(module, "upcast_kept_as_input",
                            lambda *_: contextlib.nullcontext())
    y_kept, grad_kept = norm_and_grad(kind, x, grad_y, transposed)
    as_int = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(y.view(as_int), y_kept.view(as_int))
    assert torch.equal(grad.view(as_int), grad_kept.view(as_int))


# run in a fresh interpreter: in a process that has freed memory before (earlier tests),
# the allocator may hand the output pages it already holds, and the kernel sees no change
HELD_AFTER_FORWARD = """
import sys, torch
from mebp_core.kernel_memory import read_memory
sys.path.insert(0, sys.argv[2])
from test_rmsnorm_saved import frozen_norm
x = torch.randn(4096, 4096).to(torch.bfloat16).requires_grad_(True)
norm = frozen_norm(sys.argv[1], 4096, torch.bfloat16)
before = read_memory().charged_bytes
y = norm(x)
print(read_memory().charged_bytes - before)
y.sum().backward()
assert torch.isfinite(x.grad.float()).all()
"""


@pytest.mark.parametrize("kind", NORMS)
def test_the_graph_holds_the_16_bit_input_not_its_float32_copy(kind):
    """A (4096, 4096) bfloat16 input is 32 MB and its float32 copy 64 MB: after the forward
    the process holds the output (32 MB) and no copy."""
    child = subprocess.run([sys.executable, "-c", HELD_AFTER_FORWARD, kind,
                            str(Path(__file__).parent)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and child.stdout.strip(), child.stderr[-2000:]
    held = int(child.stdout.split()[-1])
    assert 28 * MB < held < 48 * MB, held / MB


def test_an_input_changed_in_place_after_the_norm_is_refused_at_its_backward():
    """Autograd would refuse a saved tensor modified in place; the input kept in its stead
    is held to the same rule, rather than giving other gradients."""
    x = torch.randn(8, 64).to(torch.bfloat16).requires_grad_(True)
    h = x * 1  # a non-leaf, as a block's input is
    y = frozen_norm("llama", 64, torch.bfloat16)(h)
    h.add_(1)
    with pytest.raises(RuntimeError, match="in-place"):
        y.sum().backward()
