"""The passes each block of a step runs, by kind: forwards without autograd (lazy weights
tiled), then per checkpointed block a recompute under autograd and its backward (whole
decompressed weights when shared, tiles otherwise), each segment's forward re-run first with
checkpoints every k blocks; one forward under autograd and one backward, both tiled, for a
graph tail's blocks and for the no-checkpoint step; MeZO's two forwards. A recompute skips
the product of the projection whose output only enters the block's output sum."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from mebp_core.config import EngineKnobs
from mebp_core.plan.workload import Workload, graph_tail_blocks, shares_decompression

# passes over the loss's vocabulary a step: MeBP's one makes the loss and its gradient, MeZO
# makes a loss in each of its two forwards, plain backprop one (its logits whole)
LOSS_PASSES = MappingProxyType({"mebp": 1, "mezo": 2, "backprop": 1})


def pass_counts(workload: Workload, knobs: EngineKnobs) -> Mapping[str, int]:
    """Block passes per step by kind: tiled or whole-weight forwards and backwards. MeZO
    runs two forwards without autograd (the loss at +eps and -eps) and no backward; plain
    backprop is the no-checkpoint case (its knobs are ``config.BACKPROP_KNOBS``)."""
    return passes_of(workload.arch.num_layers, workload.method, *pass_knobs(workload, knobs))


def pass_knobs(workload: Workload, knobs: EngineKnobs) -> tuple[int | str, bool, int]:
    """What of the knobs the passes depend on: the checkpoints, whether a block's
    recompute and backward share its decompressed weights, and the blocks of the graph
    tail (a tail of every block is the no-checkpoint step, as the engine runs it)."""
    every, tail = knobs.checkpoint_blocks, graph_tail_blocks(workload, knobs)
    if every != "none" and tail == workload.arch.num_layers:
        every, tail = "none", 0
    return every, every != "none" and workload.method != "mezo" and \
        shares_decompression(workload, knobs), tail


@lru_cache(maxsize=256)
def passes_of(layers: int, method: str, every: int | str, shared: bool,
            tail: int = 0) -> Mapping[str, int]:
    """Every block's passes together."""
    groups = groups_of(layers, method, every, shared, tail)
    return MappingProxyType({kind: sum(passes[kind] for _, _, passes in groups)
                             for kind in groups[0][2]})


Group = tuple[int, int, Mapping[str, int]]  # blocks first..stop-1 and their passes


@lru_cache(maxsize=256)
def groups_of(layers: int, method: str, every: int | str, shared: bool,
                  tail: int = 0) -> tuple[Group, ...]:
    """The blocks that run alike and their passes: every block, or the checkpointed ones,
    then a graph tail's."""
    if method == "mezo":
        return ((0, layers, MappingProxyType({
            "tiled_forward": 2 * layers, "whole_forward": 0, "tiled_backward": 0,
            "whole_backward": 0, "rerun": 0, "recompute": 0})),)
    if every == "none":
        return ((0, layers, _graph_passes(layers)),)
    head = layers - tail
    rerun = sum(min(every, head - first) - 1 for first in range(0, head, every))
    checkpointed = (0, head, MappingProxyType({
        "tiled_forward": head + rerun + (0 if shared else head),
        "whole_forward": head if shared else 0, "tiled_backward": 0 if shared else head,
        "whole_backward": head if shared else 0, "rerun": rerun, "recompute": head}))
    return (checkpointed, (head, layers, _graph_passes(tail))) if tail else (checkpointed,)


def recompute_tiles_spared(group: Mapping[str, int], skipped: str | None) -> int:
    """Tiled passes of a group the skipped projection is not decompressed in (its recompute,
    when unshared)."""
    return group["tiled_forward"] - forward_passes(group, skipped, skipped)[0]


def _graph_passes(blocks: int) -> Mapping[str, int]:
    """Blocks in one autograd graph: a forward and a backward, both tiled."""
    return MappingProxyType({"tiled_forward": blocks, "whole_forward": 0,
                             "tiled_backward": blocks, "whole_backward": 0, "rerun": 0,
                             "recompute": 0})


def forward_passes(group: Mapping[str, int], suffix: str, skipped: str | None
                    ) -> tuple[int, int]:
    """(tiled, whole) forwards of projection ``suffix`` in a group of blocks: a recompute
    (shared: the whole-weight forward) skips the product of ``skipped``, the projection
    whose output only enters the block's output sum."""
    tiled, whole = group["tiled_forward"], group["whole_forward"]
    if skipped is None or suffix != skipped or not group["recompute"]:
        return tiled, whole
    if whole:
        return tiled, whole - group["recompute"]
    return tiled - group["recompute"], whole


def block_groups(workload: Workload, knobs: EngineKnobs) -> tuple[Group, ...]:
    return groups_of(workload.arch.num_layers, workload.method,
                         *pass_knobs(workload, knobs))
