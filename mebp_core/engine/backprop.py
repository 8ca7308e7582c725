"""Plain backprop, the reference method: every activation kept, every frozen weight resident.

``make_resident`` decompresses each frozen projection and the embedding once and keeps them
in RAM (the "frozen weights kept decompressed" setting); ``run_backprop_step`` then runs one
autograd graph over the whole model, full logits included. It costs what a naive PyTorch
LoRA trainer costs, and its gradients are those ``run_mebp_step`` must reproduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mebp_core.engine.frozen import FrozenEmbedding, FrozenLinear
from mebp_core.engine.loss import IGNORE_INDEX
from mebp_core.engine.mebp import StepLoss, shift_targets
from mebp_core.engine.model import EngineModel
from mebp_core.models.base import apply_softcap


class ResidentLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` decompressed once and held as a non-trainable buffer."""

    def __init__(self, weight_name: str, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight_name = weight_name
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight, persistent=False)  # (out, in)
        self.register_buffer("bias", bias, persistent=False)  # (out,) or None

    def extra_repr(self) -> str:
        return f"{self.weight_name}, in={self.in_features}, out={self.out_features}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight.T  # (..., out), the same op order as FrozenLinear
        return y if self.bias is None else y + self.bias


class ResidentEmbedding(nn.Module):
    """Token embedding lookup into a table decompressed once."""

    def __init__(self, weight_name: str, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight_name = weight_name
        self.num_embeddings, self.embedding_dim = weight.shape
        self.register_buffer("weight", weight, persistent=False)  # (V, D)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # (B, T, D)


def make_resident(engine: EngineModel) -> int:
    """Swap every lazy frozen module for a resident one; return the bytes now resident.

    LoRA wrappers keep their branch and get the resident projection as ``base``. The bytes
    are counted as live in ``engine.working_set``, so its peak reports them. Idempotent.
    """
    dense: dict[str, torch.Tensor] = {}
    for path, module in list(engine.arch.named_modules()):
        if isinstance(module, FrozenLinear):
            weight = _decompress_once(engine, module.weight_name, module.block, dense)
            resident = ResidentLinear(module.weight_name, weight, module.bias)
        elif isinstance(module, FrozenEmbedding):
            weight = _decompress_once(engine, module.weight_name, -1, dense)
            resident = ResidentEmbedding(module.weight_name, weight)
        else:
            continue
        engine.arch.set_submodule(path, resident)
    return sum(_nbytes(w) for w in find_resident_weights(engine).values())


def find_resident_weights(engine: EngineModel) -> dict[str, torch.Tensor]:
    """HF tensor name -> resident dense weight, for every resident module of the engine."""
    return {m.weight_name: m.weight for m in engine.arch.modules()
            if isinstance(m, ResidentLinear | ResidentEmbedding)}


def run_backprop_step(engine: EngineModel, input_ids: torch.Tensor, labels: torch.Tensor, *,
                      loss_scale: float) -> StepLoss:
    """Accumulate ``loss_scale * d(sum of token losses)/d(LoRA)`` into the LoRA ``.grad``s.

    One autograd graph over embedding, blocks, norm and full (N, V) logits. Works on a lazy
    engine too (frozen weights are then decompressed again in backward), but the reference
    setting is after ``make_resident``.
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
    resident = find_resident_weights(engine).get(name)
    if resident is not None:
        return resident
    return engine.store.dequantize(name, engine.dtype)  # a lazy engine: one-off, freed after


def _decompress_once(engine: EngineModel, name: str, block: int,
                     dense: dict[str, torch.Tensor]) -> torch.Tensor:
    """The dense weight, reusing one the ``frozen_weights`` knob already made resident."""
    if name not in dense and name in engine.working_set.resident:
        dense[name] = engine.working_set.resident[name]
    if name not in dense:
        dense[name] = engine.store.dequantize(name, engine.dtype)
        engine.working_set.acquire(block, _nbytes(dense[name]))
    return dense[name]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
