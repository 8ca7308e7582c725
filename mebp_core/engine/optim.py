"""SGD and AdamW over LoRA parameters, stepped one block at a time inside the backward pass.

These follow ``torch.optim.SGD`` / ``torch.optim.AdamW`` update rules exactly (tests compare
them), but building a ``torch.optim`` optimizer pulls in ~70 MB of torch internals on first
use, a fifth of a phone's training budget, for a few lines of arithmetic on tiny tensors.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class BlockOptimizer:
    """Updates the parameters of one block; ``step`` consumes and clears their gradients."""

    def __init__(self, params: list[nn.Parameter], *, lr: float, weight_decay: float = 0.0):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay

    def step(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Stateless by default."""

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class SGD(BlockOptimizer):
    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            grad = p.grad
            if self.weight_decay:
                grad = grad.add(p, alpha=self.weight_decay)
            p.add_(grad, alpha=-self.lr)
        self.zero_grad()


class AdamW(BlockOptimizer):
    def __init__(self, params: list[nn.Parameter], *, lr: float, weight_decay: float = 0.01,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.betas = betas
        self.eps = eps
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1 ** self.steps
        bias_correction2_sqrt = math.sqrt(1 - beta2 ** self.steps)
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq, strict=True):
            if p.grad is None:
                continue
            p.mul_(1 - self.lr * self.weight_decay)
            m.lerp_(p.grad, 1 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / bias_correction1)
        self.zero_grad()

    def state_dict(self) -> dict:
        return {"steps": self.steps, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]
        self.exp_avg = [t.clone() for t in state["exp_avg"]]
        self.exp_avg_sq = [t.clone() for t in state["exp_avg_sq"]]


def make_optimizer(name: str, params: list[nn.Parameter], *, lr: float,
                   weight_decay: float) -> BlockOptimizer:
    if name == "sgd":
        return SGD(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer: unknown value {name!r} (sgd or adamw)")
