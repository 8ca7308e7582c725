"""The frozen weights a configuration holds decompressed, in bytes: the resident set (a
budget's first weights, kept for the whole run) and the transient arenas (the largest lazy
tile, an MLP column chunk's slice, and a block's weights decompressed whole for its backward
when decompression is shared)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import Architecture
from mebp_core.plan.timing import MEMO_ENTRIES
from mebp_core.plan.workload import shape_of, tile_rows
from mebp_core.resident import block_index, select_resident


@dataclass(frozen=True)
class Residency:
    """The frozen weights a configuration keeps decompressed, and their bytes together."""

    names: frozenset[str]
    bytes: int


_NOTHING_RESIDENT = Residency(frozenset(), 0)


def resident_weights(arch: Architecture, knobs: EngineKnobs, e: int) -> Residency:
    if knobs.frozen_weights != "resident":
        return _NOTHING_RESIDENT
    return resident_within(arch, knobs.resident_weight_bytes, e)


@lru_cache(maxsize=MEMO_ENTRIES)
def resident_within(arch: Architecture, budget_bytes: int | None, e: int) -> Residency:
    """What a resident budget of ``budget_bytes`` (None: every weight) keeps, at ``e`` bytes
    a parameter."""
    sizes = {name: params * e for name, params in arch.frozen_weights()}
    names = select_resident(sizes.items(), budget_bytes)
    return Residency(frozenset(names), sum(sizes[name] for name in names))


def transient_weights(arch: Architecture, knobs: EngineKnobs, e: int, em: int,
                       resident: frozenset[str], shared: bool,
                       shared_blocks: int | None = None,
                       mlp_width: int | None = None) -> Mapping[str, int]:
    """The tile arena (largest lazy tile in the matmul dtype, forward and head, or largest
    upcast tile of a held weight; an MLP column chunk's slice, ``mlp_width`` columns, is
    made whole whatever the tile) and the shared arena (the largest lazy weights of a block
    among the first ``shared_blocks``, all by default, decompressed whole in the storage
    dtype for its backward)."""
    arenas = _transient_arenas(arch, knobs.decompress_tile_bytes, knobs.loss_vocab_tile_bytes,
                               e, em, resident, shared,
                               arch.num_layers if shared_blocks is None else shared_blocks)
    if mlp_width is None or mlp_width >= arch.intermediate_size:
        return arenas
    # a shared step holds a chunk's gate and up slices from its forward to its backward
    slices = arch.hidden_size * mlp_width * em * (2 if shared else 1)
    return MappingProxyType({**arenas, "tile": max(arenas["tile"], slices)})


@lru_cache(maxsize=MEMO_ENTRIES)
def _transient_arenas(arch: Architecture, block_tile_bytes: int, head_tile_bytes: int, e: int,
                      em: int, resident: frozenset[str], shared: bool,
                      shared_blocks: int) -> Mapping[str, int]:
    tile = 0
    blocks: dict[int, int] = {}
    for name, params in arch.frozen_weights():
        if name in resident and em == e:
            continue
        rows, cols = shape_of(arch, name)
        tile_bytes = head_tile_bytes if "layers" not in name else block_tile_bytes
        tile = max(tile, tile_rows(rows, cols, tile_bytes, em) * cols * em)
        if name in resident:
            continue
        if shared and "layers" in name and block_index(name) < shared_blocks:
            block = block_index(name)
            blocks[block] = blocks.get(block, 0) + params * e
    return MappingProxyType({"tile": tile, "block": max(blocks.values(), default=0)})
