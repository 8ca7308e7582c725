"""The engine's block optimizers follow torch.optim's update rules exactly."""

from __future__ import annotations

import pytest
import torch

from mebp_core.engine.optim import make_optimizer


@pytest.mark.parametrize(("name", "weight_decay"), [("sgd", 0.0), ("sgd", 0.1), ("adamw", 0.0),
                                                    ("adamw", 0.05)])
def test_updates_match_torch_optim(name, weight_decay):
    gen = torch.Generator().manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(4, 8, generator=gen)) for _ in range(2)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    optimizer = make_optimizer(name, ours, lr=0.01, weight_decay=weight_decay)
    reference_cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[name]
    reference = reference_cls(theirs, lr=0.01, weight_decay=weight_decay)
    for _ in range(5):
        grads = [torch.randn(4, 8, generator=gen) for _ in ours]
        for p, q, g in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        optimizer.step()
        reference.step()
        assert all(p.grad is None for p in ours)  # step consumes the gradients
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        make_optimizer("lion", [], lr=0.1, weight_decay=0.0)
