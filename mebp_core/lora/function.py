"""MeSP's LoRA branch: ``(x A^T) B^T * scaling`` that saves x, A and B (and h if asked).

By default the rank-r intermediate ``h = x A^T`` is recomputed in backward instead of stored:
it costs one (N, in) x (in, r) matmul and saves N * r activations per adapted projection.
``store_hidden`` keeps it instead (the engine's ``lora_hidden`` knob).

Dtypes: A and B may be float32 master weights while x is bfloat16. The math runs in
``matmul_dtype`` (default x's dtype; A, B and x are cast on the fly, x and grad_y a bounded
chunk of rows at a time, and the casts are not saved),
the output and grad_x come back in x's dtype and grad_A / grad_B in the parameters' dtype, so
the optimizer always updates float32 masters. On a CPU with bf16 matmul instructions bf16 math
is the fast choice (upcasting cost 20% of a bf16 step on qwen2.5-0.5b there, for gradients no
closer to float32 than transformers + PEFT's own bf16 ones); without them, float32 is.
"""

from __future__ import annotations

from typing import Any

import torch

# Rows of x and grad_y upcast at a time when the math runs in a wider dtype than x: bounds
# the float32 copies (N, in) would otherwise make, to about this many bytes each.
UPCAST_CHUNK_BYTES = 1 << 20


class LoraDeltaFunction(torch.autograd.Function):
    """Autograd op for the LoRA delta with recompute of ``h``; use via :func:`lora_delta`."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float,
        store_hidden: bool, matmul_dtype: torch.dtype | None,
    ) -> torch.Tensor:
        dtype = matmul_dtype or x.dtype
        a_c, b_c = lora_a.to(dtype), lora_b.to(dtype)
        x2 = x.reshape(-1, x.shape[-1])  # (N, in)
        chunks = list(_row_chunks(x2, dtype))
        if len(chunks) == 1:
            h, y = _delta_rows(x2, a_c, b_c, scaling)
        else:
            h = x2.new_empty(x2.shape[0], a_c.shape[0], dtype=dtype)  # (N, r)
            y = x2.new_empty(x2.shape[0], b_c.shape[0])  # (N, out), x's dtype
            for rows in chunks:
                h[rows], y[rows] = _delta_rows(x2[rows], a_c, b_c, scaling)
        ctx.save_for_backward(x, lora_a, lora_b, h if store_hidden else None)
        ctx.scaling, ctx.dtype = scaling, dtype
        return y.view(*x.shape[:-1], -1)  # (..., out)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, lora_a, lora_b, stored_h = ctx.saved_tensors
        need_x, need_a, need_b = ctx.needs_input_grad[:3]
        dtype = ctx.dtype
        x2 = x.reshape(-1, x.shape[-1])  # (N, in)
        g2 = grad_y.reshape(-1, grad_y.shape[-1])  # (N, out)
        a_c, b_c = lora_a.to(dtype), lora_b.to(dtype)
        grad_a = torch.zeros_like(a_c) if need_a else None  # (r, in), summed over chunks
        grad_b = torch.zeros_like(b_c) if need_b else None  # (out, r)
        chunks = list(_row_chunks(x2, dtype, g2))
        grad_x = None
        if need_x and len(chunks) > 1:
            grad_x = torch.empty_like(x2)  # (N, in), x's dtype, filled chunk by chunk
        for rows in chunks:
            x_c, g_c = x2[rows].to(dtype), g2[rows].to(dtype)
            if need_b:
                h = x_c @ a_c.T if stored_h is None else stored_h[rows]
                grad_b.addmm_(g_c.T, h, alpha=ctx.scaling)
                del h
            if need_x or need_a:
                grad_h = (g_c @ b_c) * ctx.scaling  # (chunk, r)
                if need_a:
                    grad_a.addmm_(grad_h.T, x_c)
                if need_x:
                    rows_grad = (grad_h @ a_c).to(x.dtype)
                    if grad_x is None:
                        grad_x = rows_grad
                    else:
                        grad_x[rows] = rows_grad
        return (None if grad_x is None else grad_x.view(x.shape),
                None if grad_a is None else grad_a.to(lora_a.dtype),
                None if grad_b is None else grad_b.to(lora_b.dtype), None, None, None)


def _delta_rows(x_rows: torch.Tensor, a_c: torch.Tensor, b_c: torch.Tensor, scaling: float):
    """``h = x A^T`` and the delta ``h B^T * scaling`` of some rows, the delta in x's dtype."""
    h = x_rows.to(a_c.dtype) @ a_c.T
    return h, ((h @ b_c.T) * scaling).to(x_rows.dtype)


def _row_chunks(x2: torch.Tensor, dtype: torch.dtype, *others: torch.Tensor):
    """Slices of rows: all of them at once when nothing is upcast (the casts are no-ops),
    else as many as keep each upcast copy near ``UPCAST_CHUNK_BYTES``."""
    n = x2.shape[0]
    if all(t.dtype == dtype for t in (x2, *others)):
        yield slice(0, n)
        return
    widest = max(t.shape[-1] for t in (x2, *others))
    step = max(16, UPCAST_CHUNK_BYTES // (widest * dtype.itemsize))
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


def lora_delta(
    x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float,
    store_hidden: bool = False, matmul_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``(x @ A.T) @ B.T * scaling`` for x (..., in), A (r, in), B (out, r); out in x's dtype."""
    return LoraDeltaFunction.apply(x, lora_a, lora_b, float(scaling), store_hidden,
                                   matmul_dtype)
