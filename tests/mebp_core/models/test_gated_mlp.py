"""A chained graph's MLP keeps gate's and up's outputs alone: the same gradients, bit for bit,
as plain autograd over ``down(act(gate) * up)``, and two (tokens, intermediate) tensors
fewer held, as the kernel counts the process."""

from __future__ import annotations

import gc

import pytest
import torch

from mebp_core.lora.function import lora_delta
from mebp_core.models.base import ACTIVATIONS, chained_graph, gated_down, gated_mlp


def _inputs(dtype, tokens=48, hidden=32, width=80, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).requires_grad_(True)
    weights = [torch.randn(hidden, width, generator=gen).to(dtype) for _ in range(2)]
    lora_a = torch.randn(4, width, generator=gen).requires_grad_(True)  # down's LoRA, float32
    lora_b = torch.randn(hidden, 4, generator=gen).requires_grad_(True)
    return x, weights, lora_a, lora_b


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_are_plain_autograds_to_the_bit(activation, dtype):
    act = ACTIVATIONS[activation]
    grads = []
    for gated in (False, True):
        x, (wg, wu), lora_a, lora_b = _inputs(dtype)

        def down(a, lora_a=lora_a, lora_b=lora_b):
            return lora_delta(a, lora_a, lora_b, 2.0)

        gate, up = x @ wg, x @ wu
        y = gated_down(gate, up, act, down) if gated else down(act(gate) * up)
        y.backward(torch.ones_like(y))
        grads.append((x.grad, lora_a.grad, lora_b.grad))
    for plain, gated in zip(*grads, strict=True):
        assert torch.equal(plain, gated)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


class _MLP(torch.nn.Module):
    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, width, bias=False)
        self.up_proj = torch.nn.Linear(hidden, width, bias=False)
        self.down_proj = torch.nn.Linear(width, hidden, bias=False)
        self.act_fn = ACTIVATIONS["silu"]


@pytest.mark.parametrize("chained", [False, True])
def test_a_chained_graph_holds_two_intermediate_tensors_not_four(chained):
    """(tokens, intermediate) float32 tensors of 64 MB: glibc maps each and gives it back
    to the kernel when freed, so the process's resident set shows what the graph holds."""
    tokens, hidden, width = 2048, 64, 8192
    mlp = _MLP(hidden, width).requires_grad_(False)
    mlp.down_proj.weight.requires_grad_(True)  # down saves its input, as a LoRA branch does
    x = torch.randn(tokens, hidden, requires_grad=True)
    wide = tokens * width * 4
    gc.collect()
    before = _rss_bytes()
    with chained_graph() if chained else torch.enable_grad():
        y = gated_mlp(mlp, x)
    held = (_rss_bytes() - before) / wide
    expected = 2 if chained else 4
    assert expected - 0.5 < held < expected + 0.5, held
    y.sum().backward()
    assert mlp.down_proj.weight.grad is not None
