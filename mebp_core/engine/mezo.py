"""MeZO (Malladi et al. 2023): zeroth-order SGD on the LoRA parameters, forward passes only.

One step: theta += eps z, loss+; theta -= 2 eps z, loss-; g = (loss+ - loss-) / (2 eps);
theta += eps z; theta -= lr (g z + weight_decay theta). z ~ N(0, 1) is never stored: one
generator seeded with the step seed redraws it parameter by parameter, in the same order, on
every pass, so at most one parameter's z exists at a time. The forwards are the engine's
no-grad ones (lazy weights, tiled head), so memory stays at inference level.

Restoring by add/subtract is not bit-exact in floating point (as in MeZO's reference): each
element of theta ends within a few float32 ulps of |theta| + 2 eps |z| of where it started.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.mebp import count_valid_targets, evaluate_batch, run_mebp_step
from mebp_core.engine.model import EngineModel


@dataclass
class MezoResult:
    loss_plus: float  # mean token loss at theta + eps z
    loss_minus: float  # mean token loss at theta - eps z
    projected_grad: float  # (loss_plus - loss_minus) / (2 eps), an estimate of <grad, z>
    loss: float  # (loss_plus + loss_minus) / 2: the loss at theta up to O(eps^2)


def derive_step_seed(seed: int, step: int) -> int:
    """A 63-bit per-step seed from the run seed and the step (stable across processes)."""
    digest = hashlib.sha256(f"mezo:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def named_lora_parameters(engine: EngineModel) -> list[tuple[str, nn.Parameter]]:
    """Trainable LoRA parameters by HF-style name (``<path>.lora_A.weight``), in a fixed order."""
    return [(f"{path}.{name}", param) for path, module in engine.lora.items()
            for name, param in module.named_parameters() if param.requires_grad]


def draw_direction(param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """z for one parameter: standard normal, its shape and dtype."""
    return torch.randn(param.shape, generator=generator, dtype=param.dtype)


def iter_directions(params: list[torch.Tensor],
                    step_seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each parameter with its z; the same seed and order give the same z on every pass."""
    generator = torch.Generator().manual_seed(step_seed)
    for param in params:
        yield param, draw_direction(param, generator)


@torch.no_grad()
def perturb_parameters(params: list[torch.Tensor], step_seed: int, scale: float) -> None:
    """theta += scale * z, in place, one parameter at a time."""
    for param, z in iter_directions(params, step_seed):
        param.add_(z, alpha=scale)


def measure_mean_loss(engine: EngineModel, input_ids: torch.Tensor,
                      labels: torch.Tensor) -> float:
    result = evaluate_batch(engine, input_ids, labels)
    return result.loss_sum / max(result.valid_tokens, 1)


def measure_projected_gradient(engine: EngineModel, input_ids: torch.Tensor,
                               labels: torch.Tensor, *, step_seed: int,
                               eps: float) -> tuple[float, float, float]:
    """``(loss+, loss-, projected_grad)``; leaves the parameters at theta - eps z."""
    params = [param for _, param in named_lora_parameters(engine)]
    perturb_parameters(params, step_seed, eps)
    loss_plus = measure_mean_loss(engine, input_ids, labels)
    perturb_parameters(params, step_seed, -2 * eps)
    loss_minus = measure_mean_loss(engine, input_ids, labels)
    return loss_plus, loss_minus, (loss_plus - loss_minus) / (2 * eps)


def run_mezo_step(engine: EngineModel, input_ids: torch.Tensor, labels: torch.Tensor, *,
                  step_seed: int, eps: float = 1e-3, lr: float,
                  weight_decay: float = 0.0) -> MezoResult:
    """One MeZO-SGD step on the engine's LoRA parameters: two forwards, no backward."""
    loss_plus, loss_minus, projected_grad = measure_projected_gradient(
        engine, input_ids, labels, step_seed=step_seed, eps=eps)
    params = [param for _, param in named_lora_parameters(engine)]
    restore_and_update(params, step_seed, eps=eps, lr=lr, projected_grad=projected_grad,
                       weight_decay=weight_decay)
    return MezoResult(loss_plus, loss_minus, projected_grad, (loss_plus + loss_minus) / 2)


@torch.no_grad()
def restore_and_update(params: list[torch.Tensor], step_seed: int, *, eps: float, lr: float,
                       projected_grad: float, weight_decay: float) -> None:
    """From theta - eps z: theta += eps z, then theta -= lr (g z + wd theta), one z draw each."""
    for param, z in iter_directions(params, step_seed):
        param.add_(z, alpha=eps)
        step = z.mul_(projected_grad)
        if weight_decay:
            step.add_(param, alpha=weight_decay)
        param.add_(step, alpha=-lr)


def estimate_mezo_gradient(engine: EngineModel, input_ids: torch.Tensor, labels: torch.Tensor,
                           step_seed: int, eps: float = 1e-3) -> dict[str, torch.Tensor]:
    """The one-sample MeZO gradient estimate ``projected_grad * z`` per LoRA parameter.

    For analysis: unlike a step it holds a full LoRA-sized result. Parameters are restored.
    """
    _, _, projected_grad = measure_projected_gradient(
        engine, input_ids, labels, step_seed=step_seed, eps=eps)
    named = named_lora_parameters(engine)
    estimate = {}
    with torch.no_grad():
        directions = iter_directions([param for _, param in named], step_seed)
        for (name, _), (param, z) in zip(named, directions, strict=True):
            param.add_(z, alpha=eps)
            estimate[name] = z.mul_(projected_grad)
    return estimate


def compute_exact_gradient(engine: EngineModel, input_ids: torch.Tensor,
                           labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """d(mean token loss)/d(LoRA) by the MeBP step; the parameters' ``.grad`` are left as found."""
    named = named_lora_parameters(engine)
    saved = [param.grad for _, param in named]
    for _, param in named:
        param.grad = None
    checkpoints = make_checkpoints("ram")
    try:
        run_mebp_step(engine, input_ids, labels, checkpoints,
                      loss_scale=1.0 / max(count_valid_targets(labels), 1))
    finally:
        checkpoints.close()
    exact = {name: param.grad if param.grad is not None else torch.zeros_like(param)
             for name, param in named}
    for (_, param), grad in zip(named, saved, strict=True):
        param.grad = grad
    return exact


def cosine_similarity(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """Cosine of two gradients flattened over all parameters (float64 sums; nan if one is 0)."""
    dot = first_sq = second_sq = 0.0
    for name, a in first.items():
        a, b = a.double(), second[name].double()
        dot += float((a * b).sum())
        first_sq += float((a * a).sum())
        second_sq += float((b * b).sum())
    if first_sq == 0.0 or second_sq == 0.0:
        return math.nan
    return dot / math.sqrt(first_sq * second_sq)


def cosine_similarity_to_true_gradient(engine: EngineModel, input_ids: torch.Tensor,
                                       labels: torch.Tensor, *, step_seed: int,
                                       eps: float = 1e-3) -> float:
    """Cosine between the MeZO estimate and the exact LoRA gradient at the same theta."""
    exact = compute_exact_gradient(engine, input_ids, labels)
    estimate = estimate_mezo_gradient(engine, input_ids, labels, step_seed, eps)
    return cosine_similarity(exact, estimate)
