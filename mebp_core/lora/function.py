"""MeSP's LoRA branch: ``(x A^T) B^T * scaling`` that saves x, A and B (and h if asked).

By default the rank-r intermediate ``h = x A^T`` is recomputed in backward instead of stored:
it costs one (N, in) x (in, r) matmul and saves N * r activations per adapted projection.
``store_hidden`` keeps it instead (the engine's ``lora_hidden`` knob).

Dtypes: A and B may be float32 master weights while x is bfloat16. The math runs in
``matmul_dtype`` (default x's dtype; A, B and x are cast on the fly, the casts are not saved),
the output and grad_x come back in x's dtype and grad_A / grad_B in the parameters' dtype, so
the optimizer always updates float32 masters. On a CPU with bf16 matmul instructions bf16 math
is the fast choice (upcasting cost 20% of a bf16 step on qwen2.5-0.5b there, for gradients no
closer to float32 than transformers + PEFT's own bf16 ones); without them, float32 is.
"""

from __future__ import annotations

from typing import Any

import torch


class LoraDeltaFunction(torch.autograd.Function):
    """Autograd op for the LoRA delta with recompute of ``h``; use via :func:`lora_delta`."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float,
        store_hidden: bool, matmul_dtype: torch.dtype | None,
    ) -> torch.Tensor:
        dtype = matmul_dtype or x.dtype
        h = x.to(dtype) @ lora_a.to(dtype).T  # (..., r)
        ctx.save_for_backward(x, lora_a, lora_b, h if store_hidden else None)
        ctx.scaling, ctx.dtype = scaling, dtype
        return ((h @ lora_b.to(dtype).T) * scaling).to(x.dtype)  # (..., out)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, lora_a, lora_b, stored_h = ctx.saved_tensors
        need_x, need_a, need_b = ctx.needs_input_grad[:3]
        dtype = ctx.dtype
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)  # (N, in)
        g2 = grad_y.reshape(-1, grad_y.shape[-1]).to(dtype)  # (N, out)
        a_c = lora_a.to(dtype)  # (r, in)
        grad_x = grad_a = grad_b = None
        if need_b:
            h = x2 @ a_c.T if stored_h is None else stored_h.reshape(-1, stored_h.shape[-1])
            grad_b = ((g2.T @ h) * ctx.scaling).to(lora_b.dtype)  # (out, r)
            del h
        if need_x or need_a:
            grad_h = (g2 @ lora_b.to(dtype)) * ctx.scaling  # (N, r)
            if need_a:
                grad_a = (grad_h.T @ x2).to(lora_a.dtype)  # (r, in)
            if need_x:
                grad_x = (grad_h @ a_c).reshape(x.shape).to(x.dtype)  # (..., in)
        return grad_x, grad_a, grad_b, None, None, None


def lora_delta(
    x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float,
    store_hidden: bool = False, matmul_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``(x @ A.T) @ B.T * scaling`` for x (..., in), A (r, in), B (out, r); out in x's dtype."""
    return LoraDeltaFunction.apply(x, lora_a, lora_b, float(scaling), store_hidden,
                                   matmul_dtype)
