"""Which frozen weights a byte budget keeps decompressed: shared by the engine and the planner,
so the prediction and the run pick the same set."""

from __future__ import annotations

from collections.abc import Iterable


def block_index(name: str) -> int:
    """The block a Hugging Face tensor name belongs to (``model.layers.<i>...``), else -1."""
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else -1


def residency_order(name: str) -> tuple[int, str]:
    """Block projections first, from block 0 (with the default knobs a resident block byte
    saves two decompressions per step, a head byte one), then the output head."""
    block = block_index(name)
    return (block if block >= 0 else 1 << 30), name


def select_resident(weights: Iterable[tuple[str, int]], budget_bytes: int | None) -> list[str]:
    """Names of the weights kept resident: all of them without a budget, otherwise each weight
    in residency order that still fits in what the budget has left."""
    chosen, left = [], budget_bytes
    for name, nbytes in sorted(weights, key=lambda item: residency_order(item[0])):
        if left is None or nbytes <= left:
            chosen.append(name)
            if left is not None:
                left -= nbytes
    return chosen
