"""Learning-rate schedules, as a function of the 1-based optimizer step."""

from __future__ import annotations

import math

from mebp_core.config import TrainConfig


def compute_lr(config: TrainConfig, step: int) -> float:
    """Linear warmup over ``warmup_steps``, then constant or cosine decay to zero.

    Same multipliers as transformers' ``get_constant_schedule_with_warmup`` and
    ``get_cosine_schedule_with_warmup`` (which count steps from 0).
    """
    done = step - 1
    if done < config.warmup_steps:
        return config.lr * done / max(1, config.warmup_steps)
    if config.schedule == "constant":
        return config.lr
    progress = (done - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
