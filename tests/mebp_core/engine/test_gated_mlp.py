"""A chained graph's MLP keeps gate's and up's outputs alone: the same gradients, bit for bit,
as plain autograd over ``down(act(gate) * up)``, and two (tokens, intermediate) tensors
fewer held, as the kernel counts the process."""

from __future__ import annotations

import gc

import pytest
import torch

from mebp_core.engine.gated_mlp import project_gated
from mebp_core.lora.linear import LoraLinear
from mebp_core.models.base import ACTIVATIONS


def _lora(base: torch.nn.Linear, gen: torch.Generator) -> LoraLinear:
    base.requires_grad_(False)
    return LoraLinear(base, torch.randn(4, base.in_features, generator=gen),
                      torch.randn(base.out_features, 4, generator=gen), 2.0)


def _mlp(dtype: torch.dtype, adapted: set[str], hidden=32, width=80, seed=0):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    shapes = {"gate": (hidden, width), "up": (hidden, width), "down": (width, hidden)}
    layers = {}
    for name, (inp, out) in shapes.items():
        linear = torch.nn.Linear(inp, out, bias=False).to(dtype).requires_grad_(False)
        layers[name] = _lora(linear, gen) if name in adapted else linear
    return layers


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("adapted", [{"gate", "up", "down"}, {"down"}, {"gate"}, {"up"}])
def test_gradients_are_plain_autograds_to_the_bit(activation, dtype, adapted):
    """(B, T, D) inputs, LoRA on some projections: which of gate and up need a gradient
    varies (x needs one throughout, as a block's input does)."""
    act = ACTIVATIONS[activation]
    grads = []
    for gated in (False, True):
        layers = _mlp(dtype, adapted)
        x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
        x.requires_grad_(True)
        gate, up = layers["gate"](x), layers["up"](x)
        y = project_gated(gate, up, act, layers["down"]) if gated else \
            layers["down"](act(gate) * up)
        y.backward(torch.ones_like(y))
        grads.append([x.grad] + [p.grad for layer in layers.values()
                                 for p in layer.parameters() if p.requires_grad])
    for plain, gated in zip(*grads, strict=True):
        assert torch.equal(plain, gated)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.mark.parametrize("gated", [False, True])
def test_the_graph_holds_two_intermediate_tensors_not_four(gated):
    """(tokens, intermediate) float32 tensors of 64 MB: glibc maps each and gives it back to
    the kernel when freed, so the process's resident set shows what the graph holds. Down is
    a torch Linear over (B, T, intermediate): its graph saves a flattened view of its input,
    which the gated graph recomputes too."""
    batch, tokens, hidden, width = 2, 1024, 64, 8192
    gate_proj, up_proj, down = (torch.nn.Linear(a, b, bias=False).requires_grad_(False)
                                for a, b in ((hidden, width), (hidden, width), (width, hidden)))
    down.weight.requires_grad_(True)  # down saves its input, as a LoRA branch does
    act = ACTIVATIONS["silu"]
    x = torch.randn(batch, tokens, hidden, requires_grad=True)
    gc.collect()
    before = _rss_bytes()
    gate, up = gate_proj(x), up_proj(x)
    y = project_gated(gate, up, act, down) if gated else down(act(gate) * up)
    del gate, up
    held = (_rss_bytes() - before) / (batch * tokens * width * 4)
    expected = 2 if gated else 4
    assert expected - 0.5 < held < expected + 0.5, held
    y.sum().backward()
    assert down.weight.grad is not None
