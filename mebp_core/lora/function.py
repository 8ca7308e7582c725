"""MeSP's LoRA branch: ``(x A^T) B^T * scaling`` that saves only x, A and B.

The rank-r intermediate ``h = x A^T`` is recomputed in backward instead of stored: it costs
one (N, in) x (in, r) matmul and saves N * r activations per adapted projection.

Dtypes: as in PEFT, the branch runs in the adapter's dtype (float32 masters) even when x is
bfloat16: x is cast on the fly (the cast is not saved), the delta comes out in the adapter's
dtype, and grad_x goes back in x's dtype.
"""

from __future__ import annotations

from typing import Any

import torch


class LoraDeltaFunction(torch.autograd.Function):
    """Autograd op for the LoRA delta with recompute of ``h``; use via :func:`lora_delta`."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        ctx.save_for_backward(x, lora_a, lora_b)
        ctx.scaling = scaling
        h = x.to(lora_a.dtype) @ lora_a.T  # (..., r)
        return (h @ lora_b.T) * scaling  # (..., out), in the adapter's dtype

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, lora_a, lora_b = ctx.saved_tensors
        need_x, need_a, need_b = ctx.needs_input_grad[:3]
        dtype = lora_a.dtype
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)  # (N, in)
        g2 = grad_y.reshape(-1, grad_y.shape[-1]).to(dtype)  # (N, out)
        grad_x = grad_a = grad_b = None
        if need_b:
            h = x2 @ lora_a.T  # (N, r), recomputed, never saved
            grad_b = (g2.T @ h) * ctx.scaling  # (out, r)
            del h
        if need_x or need_a:
            grad_h = (g2 @ lora_b) * ctx.scaling  # (N, r)
            if need_a:
                grad_a = grad_h.T @ x2  # (r, in)
            if need_x:
                grad_x = (grad_h @ lora_a).reshape(x.shape).to(x.dtype)  # (..., in)
        return grad_x, grad_a, grad_b, None


def lora_delta(
    x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """``(x @ A.T) @ B.T * scaling`` for x (..., in), A (r, in), B (out, r), in A's dtype."""
    return LoraDeltaFunction.apply(x, lora_a, lora_b, float(scaling))
