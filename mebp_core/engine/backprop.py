"""Plain backprop, the reference method: one autograd graph over the whole model, full logits
included, every activation kept. Its config's knobs (``config.BACKPROP_KNOBS``) keep every
frozen projection and the head decompressed in RAM, accounted like any resident weight. It
costs what a naive PyTorch LoRA trainer costs, and its gradients are those
``run_mebp_step`` must reproduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mebp_core.engine.loss import IGNORE_INDEX
from mebp_core.engine.mebp import StepLoss, shift_targets
from mebp_core.engine.model import EngineModel
from mebp_core.models.base import apply_softcap


def run_backprop_step(engine: EngineModel, input_ids: torch.Tensor, labels: torch.Tensor, *,
                      loss_scale: float) -> StepLoss:
    """Accumulate ``loss_scale * d(sum of token losses)/d(LoRA)`` into the LoRA ``.grad``s.

    One autograd graph over embedding, blocks, norm and full (N, V) logits. Works on a lazy
    engine too (frozen weights are then decompressed again in backward), but the reference
    setting is the backprop knobs' resident weights.
    """
    ctx = engine.context(input_ids.shape[1])
    with torch.enable_grad():
        hidden = engine.arch.embed(input_ids).to(engine.dtype)  # (B, T, D)
        for layer in engine.layers:
            hidden = layer(hidden, ctx)
        normed = engine.arch.final_norm(hidden)
        loss_sum, valid, correct = compute_full_logits_loss(engine, normed, labels)
        (loss_sum * loss_scale).backward()
    return StepLoss(float(loss_sum.detach()), valid, correct)


def compute_full_logits_loss(engine: EngineModel, normed: torch.Tensor,
                             labels: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Summed token cross-entropy, valid and correct target counts, from full logits."""
    targets = shift_targets(labels).reshape(-1)  # (N,)
    weight = _head_weight(engine)  # (V, D)
    logits = (normed.reshape(-1, normed.shape[-1]) @ weight.T).float()  # (N, V)
    logits = apply_softcap(logits, engine.arch.logit_softcap)
    loss_sum = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    valid = targets != IGNORE_INDEX
    correct = int((logits.detach().argmax(dim=1) == targets)[valid].sum())
    return loss_sum, int(valid.sum()), correct


def _head_weight(engine: EngineModel) -> torch.Tensor:
    name = engine.arch.head_weight_name
    resident = engine.working_set.resident.get(name)
    if resident is not None:
        return resident
    return engine.store.dequantize(name, engine.dtype)  # a lazy engine: one-off, freed after
