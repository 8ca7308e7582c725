"""A block of a chained autograd graph (a graph tail, the no-checkpoint step), its MLP keeping
gate's and up's outputs alone for backward.

Plain autograd over ``down(act(gate) * up)`` keeps four (tokens, intermediate) tensors a
block: gate, up, the activation and the product (down's LoRA branch reads it). A chain holds
every block's graph at once, so here the activation and the product are recomputed from gate
and up in the backward (elementwise: the same bits, and the same gradients to the bit),
halving what a block holds. A block recomputed alone keeps all four: there the two tensors
spared showed no gain (qwen2.5-0.5b seq 256, four float32 runs 5-18 MB higher, inside the
heap's run-to-run spread of ~16 MB).

The saved-tensor hooks that stand in for the product apply to down's forward only; nested
hooks replace outer ones there (``torch.autograd.graph.saved_tensors_hooks``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from mebp_core.models.base import Activation
from mebp_core.models.saved_tensors import remade_when_read

T = TypeVar("T")


def run_chained_block(block, hidden: torch.Tensor, ctx) -> torch.Tensor:
    """``block(hidden, ctx)`` under autograd, its MLP's graph keeping gate and up alone."""
    middle = block.attention_part(hidden, ctx)
    mlp = block.mlp
    x = block.mlp_input(middle)
    return block.mlp_output(middle, project_gated(mlp.gate_proj(x), mlp.up_proj(x),
                                                  mlp.act_fn, mlp.down_proj))


def project_gated(gate: torch.Tensor, up: torch.Tensor, act: Activation,
                  down: Callable[[torch.Tensor], T]) -> T:
    """``down(act(gate) * up)``, whose graph keeps ``gate`` and ``up`` alone: what down saves
    of its input (the product, or a view of it) is recomputed when its backward reads it."""
    if not (torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)):
        return down(act(gate) * up)
    product = _GatedProduct.apply(gate, up, act)

    def remake() -> torch.Tensor:
        with torch.no_grad():
            return act(gate) * up

    with remade_when_read(product, remake):
        return down(product)


class _GatedProduct(torch.autograd.Function):
    """``act(gate) * up`` saving its inputs only: backward recomputes ``act(gate)`` and runs
    the ops autograd would (the product's two gradients, then the activation's backward)."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, act: Activation) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        ctx.act = act
        return act(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        need_gate, need_up = ctx.needs_input_grad[:2]
        grad_up = grad * ctx.act(gate) if need_up else None
        grad_gate = ctx.act.backward(grad * up, gate) if need_gate else None
        return grad_gate, grad_up, None
