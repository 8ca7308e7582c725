"""Combining the adapters devices trained in a round into the next global adapter.

``fedavg`` averages A and B separately, each device weighted by its examples (FedIT). The
product of averages is not the average of products, so the global update is approximate.
``ffa`` (FFA-LoRA) keeps A frozen at one shared seeded init on every device and trains only
B; the delta ``B A`` is linear in B, so averaging B averages the devices' updates exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from mebp_core.errors import MebpError
from mebp_core.lora.peft_io import Adapters

Aggregation = Literal["none", "fedavg", "ffa"]


class AggregationError(MebpError, ValueError):
    """Adapters that cannot be combined (different modules, shapes, or, for ffa, A)."""


@dataclass(frozen=True)
class Update:
    """One device's adapter after its local steps, and how many examples it trained on."""

    name: str
    adapters: Adapters
    examples: int


def aggregate(updates: Sequence[Update], how: Aggregation) -> Adapters:
    """The global adapter from ``updates`` (at least one), by ``how``."""
    if how not in ("fedavg", "ffa"):
        raise AggregationError(f"aggregation {how!r} combines nothing (known: fedavg, ffa)")
    if not updates:
        raise AggregationError("no device finished this round: nothing to aggregate")
    check_compatible(updates, same_a=how == "ffa")
    total = sum(update.examples for update in updates)
    if total <= 0:
        raise AggregationError("the updates trained on no examples")
    weights = [update.examples / total for update in updates]
    first = updates[0].adapters
    combined: Adapters = {}
    for path, (lora_a, _) in first.items():
        mean_b = weighted_mean([u.adapters[path][1] for u in updates], weights)
        mean_a = lora_a.clone() if how == "ffa" else weighted_mean(
            [u.adapters[path][0] for u in updates], weights)
        combined[path] = (mean_a, mean_b)
    return combined


def weighted_mean(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Summed in float64, returned in the tensors' dtype: the order of devices never
    changes the result beyond that dtype's rounding."""
    total = torch.zeros(tensors[0].shape, dtype=torch.float64)
    for tensor, weight in zip(tensors, weights, strict=True):
        total += tensor.to(torch.float64) * weight
    return total.to(tensors[0].dtype)


def check_compatible(updates: Sequence[Update], *, same_a: bool) -> None:
    first = updates[0]
    for update in updates[1:]:
        if update.adapters.keys() != first.adapters.keys():
            raise AggregationError(f"{update.name} adapts other modules than {first.name}")
        for path, (lora_a, lora_b) in update.adapters.items():
            ref_a, ref_b = first.adapters[path]
            if lora_a.shape != ref_a.shape or lora_b.shape != ref_b.shape:
                raise AggregationError(f"{update.name}: {path} has another shape than in "
                                       f"{first.name}")
            if same_a and not torch.equal(lora_a, ref_a):
                raise AggregationError(f"{update.name}: {path}'s A differs from {first.name}'s; "
                                       "ffa needs A frozen at the shared init")
