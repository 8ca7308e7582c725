"""The one way the engine starts a backward from a tensor and its given gradient."""

from __future__ import annotations

import torch


def backward_from(output: torch.Tensor, grad: torch.Tensor) -> None:
    """``output.backward(grad)``, written as a scalar backward: d sum(o * g) / d o is exactly g,
    and this skips torch's tensor-gradient shape check, which imports sympy (~35 MB)."""
    torch.sum(output * grad).backward()


def backward_from_parts(outputs: list[torch.Tensor], grad: torch.Tensor) -> None:
    """``backward_from(sum(outputs), grad)`` with neither the sum nor an ``output * grad``
    product made: each output is handed ``grad`` itself (an expanded zero output costs
    nothing)."""
    torch.stack([_GivenGradient.apply(output, grad) for output in outputs]).sum().backward()


class _GivenGradient(torch.autograd.Function):
    """A zero scalar whose backward hands ``grad`` to ``output`` as its gradient."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        ctx.grad = grad
        return output.new_zeros((), dtype=torch.float32)

    @staticmethod
    def backward(ctx, _: torch.Tensor):
        return ctx.grad, None
