"""The single-pass chunked head loss equals cross-entropy on full logits, softcap included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mebp_core.engine.frozen import WeightWorkingSet
from mebp_core.engine.loss import IGNORE_INDEX, compute_head_loss
from mebp_core.store.reader import open_store


@pytest.mark.parametrize("softcap", [None, 3.0, 30.0])
@pytest.mark.parametrize("tile_bytes", [1 << 16, 1 << 24])
def test_loss_and_gradient_equal_autograd_on_full_logits(packed_models, softcap, tile_bytes):
    store = open_store(packed_models["qwen2", "none"])
    head = "model.embed_tokens.weight"
    weight = store.dequantize(head, torch.float32)  # (V, D)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(24, weight.shape[1], generator=gen)
    targets = torch.randint(0, weight.shape[0], (24,), generator=gen)
    targets[[0, 5, 6]] = IGNORE_INDEX

    ours = compute_head_loss(hidden, targets, store=store, head_name=head,
                             dtype=torch.float32, tile_bytes=tile_bytes, softcap=softcap,
                             working_set=WeightWorkingSet())

    reference_hidden = hidden.clone().requires_grad_(True)
    logits = reference_hidden @ weight.T
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    loss.backward()
    valid = targets != IGNORE_INDEX
    assert ours.valid_tokens == int(valid.sum())
    assert ours.correct_tokens == int((logits.argmax(-1) == targets)[valid].sum())
    assert float(ours.loss_sum) == pytest.approx(float(loss), rel=1e-5)
    torch.testing.assert_close(ours.grad_hidden, reference_hidden.grad, rtol=1e-4, atol=1e-6)
