"""Who takes part in a round and what happens to them, drawn from the fleet's seed.

Every draw is keyed by (seed, round, device), so a coordinator restarted mid-round makes the
same choices again and a device's fate never depends on the others'.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Fate:
    """What a selected device does this round: trains all its local steps, or goes offline
    after ``offline_after_step`` of them."""

    offline_after_step: int | None = None


def participants(devices: int, fraction: float, seed: int, round_index: int) -> list[int]:
    """The indices of the devices selected for ``round_index``."""
    return sorted(random.Random(f"{seed}:participants:{round_index}")
                  .sample(range(devices), selected_count(devices, fraction)))


def selected_count(devices: int, fraction: float) -> int:
    """How many devices a round selects: ``fraction`` of them, rounded, and at least one."""
    if not 0 < fraction <= 1:
        raise ValueError(f"participation must be in (0, 1], got {fraction}")
    return max(1, round(fraction * devices))


def fate(seed: int, round_index: int, device: int, dropout: float, local_steps: int) -> Fate:
    """Whether the device drops out this round (with probability ``dropout``), and after
    which of its local steps."""
    rng = random.Random(f"{seed}:dropout:{round_index}:{device}")
    if rng.random() < dropout:
        return Fate(offline_after_step=rng.randint(0, local_steps - 1))
    return Fate()


def is_straggler(estimated_device_s: float | None, deadline_s: float | None) -> bool:
    """A device whose estimated on-device time for the round passes the deadline."""
    return deadline_s is not None and estimated_device_s is not None \
        and estimated_device_s > deadline_s


def reference_steps(devices: int, fraction: float, rounds: int, local_steps: int
                    ) -> tuple[int, int]:
    """The steps of a fleet's two references: each device alone on its shard for as many
    steps as the rounds would give it (local-only), and one run on the union of the shards
    that sees as many examples as all the rounds' devices together (centralized)."""
    return rounds * local_steps, rounds * selected_count(devices, fraction) * local_steps
