"""One training step per method, behind a common signature: (step, input_ids, labels) -> loss.

- ``mebp``: the memory-efficient exact backward; each block is updated as soon as its
  gradients are complete.
- ``backprop``: plain autograd with every frozen weight decompressed and resident and all
  activations kept: the fast, memory-hungry reference.
- ``mezo``: two perturbed forwards and a seed-regenerated update, no backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mebp_core.config import TrainConfig
from mebp_core.engine.backprop import make_resident, run_backprop_step
from mebp_core.engine.mebp import StepLoss, count_valid_targets, run_mebp_step
from mebp_core.engine.mezo import derive_step_seed, run_mezo_step
from mebp_core.engine.model import EngineModel
from mebp_core.engine.optim import BlockOptimizer

StepFunction = Callable[[int, torch.Tensor, torch.Tensor], StepLoss]


def make_step_function(engine: EngineModel, config: TrainConfig,
                       optimizers: list[BlockOptimizer], checkpoints) -> StepFunction:
    """The per-batch body of the training loop for ``config.method``."""
    if config.method == "mebp":
        return _mebp_step(engine, optimizers, checkpoints)
    if config.method == "backprop":
        make_resident(engine)
        return _backprop_step(engine, optimizers)
    if config.method == "mezo":
        return _mezo_step(engine, config)
    raise ValueError(f"method: unknown value {config.method!r}")


def _mebp_step(engine: EngineModel, optimizers, checkpoints) -> StepFunction:
    def step(_: int, input_ids: torch.Tensor, labels: torch.Tensor) -> StepLoss:
        valid = count_valid_targets(labels)
        return run_mebp_step(engine, input_ids, labels, checkpoints,
                             loss_scale=1.0 / max(valid, 1),
                             on_block_done=lambda index: optimizers[index].step())
    return step


def _backprop_step(engine: EngineModel, optimizers) -> StepFunction:
    def step(_: int, input_ids: torch.Tensor, labels: torch.Tensor) -> StepLoss:
        valid = count_valid_targets(labels)
        result = run_backprop_step(engine, input_ids, labels, loss_scale=1.0 / max(valid, 1))
        for optimizer in optimizers:
            optimizer.step()
        return result
    return step


def _mezo_step(engine: EngineModel, config: TrainConfig) -> StepFunction:
    def step(index: int, input_ids: torch.Tensor, labels: torch.Tensor) -> StepLoss:
        result = run_mezo_step(engine, input_ids, labels,
                               step_seed=derive_step_seed(config.seed, index),
                               eps=config.mezo_eps, lr=config.lr,
                               weight_decay=config.weight_decay)
        if not math.isfinite(result.projected_grad):
            raise FloatingPointError(f"step {index}: MeZO's projected gradient is not finite")
        valid = count_valid_targets(labels)
        return StepLoss(result.loss * valid, valid, 0)
    return step
