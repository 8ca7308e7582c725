"""One optimizer step per method, behind a common signature.

``step(index, micro_batches, lr) -> StepLoss`` consumes ``grad_accum_steps`` micro-batches.

- ``mebp``: the memory-efficient exact backward. With one micro-batch and no clipping each
  block is updated as soon as its gradients are complete (its gradients never coexist with
  the others'); otherwise gradients accumulate over the micro-batches, are clipped, and every
  block steps at the end.
- ``backprop``: plain autograd over the whole model and the full logits, all activations
  kept: the one engine's whole-graph step with the knobs ``config.BACKPROP_KNOBS`` (every
  frozen projection and the head resident) and full logits; the fast, memory-hungry
  reference.
- ``mezo``: two perturbed forwards and a seed-regenerated update, no backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.nn.utils import clip_grad_norm_

from mebp_core.config import TrainConfig
from mebp_core.engine.mebp import StepLoss, count_valid_targets, run_mebp_step
from mebp_core.engine.mezo import derive_step_seed, run_mezo_step
from mebp_core.engine.model import EngineModel
from mebp_core.engine.optim import BlockOptimizer
from mebp_core.errors import DivergedError

Batch = tuple[torch.Tensor, torch.Tensor]  # input_ids (B, T), labels (B, T)
StepFunction = Callable[[int, Sequence[Batch], float], StepLoss]


def make_step_function(engine: EngineModel, config: TrainConfig,
                       optimizers: list[BlockOptimizer], checkpoints) -> StepFunction:
    """The per-step body of the training loop for ``config.method``."""
    if config.method == "mezo":
        return _mezo_step(engine, config)
    if config.method == "backprop":  # the one engine with BACKPROP_KNOBS, and full logits
        def backward(input_ids, labels, loss_scale, on_block_done):
            return run_mebp_step(engine, input_ids, labels, checkpoints, loss_scale=loss_scale,
                                 full_logits=True)
    elif config.method == "mebp":
        def backward(input_ids, labels, loss_scale, on_block_done):
            return run_mebp_step(engine, input_ids, labels, checkpoints, loss_scale=loss_scale,
                                 on_block_done=on_block_done)
    else:
        raise ValueError(f"method: unknown value {config.method!r}")
    fused = config.method == "mebp" and config.grad_accum_steps == 1 \
        and config.max_grad_norm is None
    return _gradient_step(engine, optimizers, backward, fused=fused,
                          max_grad_norm=config.max_grad_norm)


def _gradient_step(engine: EngineModel, optimizers: list[BlockOptimizer], backward, *,
                   fused: bool, max_grad_norm: float | None) -> StepFunction:
    def step(_: int, micro_batches: Sequence[Batch], lr: float) -> StepLoss:
        for optimizer in optimizers:
            optimizer.lr = lr
        valid = sum(count_valid_targets(labels) for _, labels in micro_batches)
        on_block_done = (lambda index: optimizers[index].step()) if fused else None
        total = StepLoss(0.0, 0, 0)
        for input_ids, labels in micro_batches:
            part = backward(input_ids, labels, 1.0 / max(valid, 1), on_block_done)
            total = StepLoss(total.loss_sum + part.loss_sum, total.valid_tokens +
                             part.valid_tokens, total.correct_tokens + part.correct_tokens)
        if not fused:
            if max_grad_norm is not None:
                clip_grad_norm_(engine.lora_parameters(), max_grad_norm)
            for optimizer in optimizers:
                optimizer.step()
        return total
    return step


def _mezo_step(engine: EngineModel, config: TrainConfig) -> StepFunction:
    def step(index: int, micro_batches: Sequence[Batch], lr: float) -> StepLoss:
        (input_ids, labels), = micro_batches
        result = run_mezo_step(engine, input_ids, labels,
                               step_seed=derive_step_seed(config.seed, index),
                               eps=config.mezo_eps, lr=lr, weight_decay=config.weight_decay)
        if not math.isfinite(result.projected_grad):
            raise DivergedError(f"step {index}: MeZO's projected gradient is "
                                f"{result.projected_grad} (training diverged; lower the "
                                f"learning rate or mezo_eps)")
        valid = count_valid_targets(labels)
        return StepLoss(result.loss * valid, valid, 0)
    return step
