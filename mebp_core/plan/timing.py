"""Step time of one configuration: matmuls projection by projection at the host's measured
rate for their shape, decompressions, elementwise traffic and per-op overhead.

``step_work`` counts what a step does (the same on any machine); ``host_step_time`` prices it
at this host's calibration, and ``mebp_core.plan.devices`` at a phone's rates.

The passes each block runs are counted in ``mebp_core.plan.passes``, the ops a step
dispatches in ``mebp_core.plan.dispatch``. What each block does depends on its group
(checkpointed or in the tail), so resident weights, which are a budget's first blocks, are
priced by the passes of the blocks that hold them. Matmuls run at the rate
of the matmul dtype (``workload.matmul_bytes``); upcasting held bf16 weights is traffic.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import Architecture
from mebp_core.plan.calibration import HostCalibration
from mebp_core.plan.dispatch import block_ops, loss_tile_ops
from mebp_core.plan.passes import (
    LOSS_PASSES,
    block_groups,
    forward_passes,
    groups_of,
    pass_counts,
    pass_knobs,
    passes_of,
    recompute_tiles_spared,
)
from mebp_core.plan.workload import (
    DTYPE_BYTES,
    MLP_PROJECTIONS,
    Workload,
    adapted_projections,
    frozen_weight_suffixes,
    matmul_bytes,
    matmul_dtype_of,
    mlp_chunk_tokens,
    mlp_chunks,
    mlp_intermediate_width,
    mlp_output_passes,
    saved_bytes_per_token,
    tile_rows,
    vocab_tiles,
)
from mebp_core.resident import block_index

# Elementwise passes over a block's activations per forward, in units of its saved bytes.
ELEMENTWISE_PASSES = 3.0
# Bytes actually moved per byte counted: the temporaries and casts the count leaves out.
# Fitted on 34 plan-check runs of smollm2-135m and qwen2.5-0.5b (seq 128-1024, float32);
# held out, gemma3-1b, qwen3-0.6b and llama3.2-1b then came within 25% in 29 runs of 29.
TRAFFIC_MULTIPLIER = 2.2


@dataclass(frozen=True)
class StepWork:
    """What one step does, whatever it runs on."""

    matmuls: tuple[tuple[float, int, int, str], ...]  # (FLOPs, rows, width, form) groups
    matmul_dtype: str
    tile_params: float  # decompressed in tiles, to the matmul dtype
    tile_calls: float  # one per tile
    whole_params: float  # decompressed whole (a shared block), to the storage dtype
    whole_calls: float  # one per projection
    traffic_bytes: float  # elementwise, as counted (TRAFFIC_MULTIPLIER prices the rest)
    ops: float  # torch ops the blocks dispatch
    # and the loss's vocabulary tiles: priced on this host at its measured overhead, not on a
    # phone, whose per-op figure is fitted to the MeBP paper's engine on the blocks' ops
    loss_tile_ops: float

    @property
    def decompress_calls(self) -> float:
        return self.tile_calls + self.whole_calls

    @property
    def matmul_flops(self) -> float:
        return sum(flops for flops, *_ in self.matmuls)


def step_work(workload: Workload, knobs: EngineKnobs, resident: Collection[str], *,
              recompute_skips_residual_output: bool = True) -> StepWork:
    """What one step of ``workload.method`` does with these knobs; ``recompute_skips_
    residual_output`` False prices a recompute of the whole block (the MeBP paper's)."""
    resident = frozenset(resident)
    skipped = workload.arch.residual_output_projection if recompute_skips_residual_output \
        else None
    tile_params, tile_calls, whole_params, whole_calls = _decompress_work(
        workload, knobs, resident, skipped)
    return StepWork(matmuls=_matmul_work(workload, knobs, resident, skipped),
                    matmul_dtype=matmul_dtype_of(workload, knobs), tile_params=tile_params,
                    tile_calls=tile_calls, whole_params=whole_params,
                    whole_calls=whole_calls,
                    traffic_bytes=_traffic_bytes(workload, knobs, resident, skipped),
                    ops=block_ops(workload, knobs),
                    loss_tile_ops=loss_tile_ops(workload, knobs))


def host_step_time(work: StepWork, workload: Workload, host: HostCalibration
                   ) -> dict[str, float]:
    """Seconds per step by part at this host's measured rates."""
    matmul = host.matmul_time_s(work.matmul_dtype, work.matmuls)
    decompress = (
        work.tile_params / host.decompress_rate(
            workload.quant, work.matmul_dtype, work.tile_params / max(work.tile_calls, 1)) +
        # a shared block's weights are written one after another into one buffer
        work.whole_params / host.decompress_rate(
            workload.quant, workload.compute_dtype, workload.arch.block_params()) +
        work.decompress_calls * (host.decompress_call_s + 3 * host.op_overhead_s))
    return {"matmul": matmul, "decompress": decompress,
            "elementwise": TRAFFIC_MULTIPLIER * work.traffic_bytes /
            host.elementwise_bytes_per_s,
            "overhead": (work.ops + work.loss_tile_ops) * host.op_overhead_s, "disk": 0.0}


def step_time(workload: Workload, knobs: EngineKnobs, host: HostCalibration,
              resident: Collection[str]) -> tuple[dict[str, float], StepWork]:
    """Seconds per step by part on this host, and what the step does."""
    work = step_work(workload, knobs, resident)
    return host_step_time(work, workload, host), work


def _attention_flops(workload: Workload) -> float:
    arch = workload.arch
    return 2 * workload.tokens * workload.seq_len * arch.num_heads * arch.head_dim  # causal


def _resident_blocks(workload: Workload, resident: frozenset[str], first: int = 0,
                     stop: int | None = None) -> Mapping[str, int]:
    """Per projection suffix, how many blocks (of blocks first..stop-1) hold it resident."""
    return _resident_blocks_of(workload.arch, resident, first, stop)


# The planner's pure per-architecture sums (here and in ``predict``) are memoized on exactly
# their arguments: a plan's hundreds of candidates share a handful of residencies, tile sizes
# and pass counts, and each sum walks every weight of the model. Read-only results: callers
# share them.
MEMO_ENTRIES = 4096


@lru_cache(maxsize=MEMO_ENTRIES)
def _resident_blocks_of(arch: Architecture, resident: frozenset[str], first: int = 0,
                        stop: int | None = None) -> Mapping[str, int]:
    counts = dict.fromkeys(arch.projections(), 0)
    stop = arch.num_layers if stop is None else stop
    for name in resident:
        if "layers" in name and first <= block_index(name) < stop:
            counts[name.split(".")[-2]] += 1
    return MappingProxyType(counts)




def _matmul_work(workload: Workload, knobs: EngineKnobs, resident: frozenset[str],
                 skipped: str | None) -> tuple[tuple[float, int, int, str], ...]:
    """Each projection's FLOPs by pass kind and whether tiled, with the rows and output width
    of its matmuls; attention; the head's vocabulary tiles."""
    return _matmuls(workload, matmul_bytes(workload, knobs), *pass_knobs(workload, knobs),
                    resident, mlp_chunk_tokens(workload, knobs),
                    mlp_intermediate_width(workload, knobs), knobs.decompress_tile_bytes,
                    knobs.loss_vocab_tile_bytes, skipped)


@lru_cache(maxsize=MEMO_ENTRIES)
def _matmuls(workload: Workload, e: int, every: int | str, shared: bool, tail: int,
             resident: frozenset[str], chunk: int, width: int, block_tile_bytes: int,
             head_tile_bytes: int, skipped: str | None
             ) -> tuple[tuple[float, int, int, str], ...]:
    arch, n = workload.arch, workload.tokens
    groups = groups_of(arch.num_layers, workload.method, every, shared, tail)
    passes = passes_of(arch.num_layers, workload.method, every, shared, tail)
    resident_in = [_resident_blocks(workload, resident, first, stop)
                   for first, stop, _ in groups]
    work = []
    for suffix, (out, inp) in arch.projections().items():
        flops = 2 * n * out * inp
        if suffix in MLP_PROJECTIONS:  # the same FLOPs, a chunk's columns at a time
            out, inp = _column_chunk_shape(arch, out, inp, width)
        tile = tile_rows(out, inp, block_tile_bytes, e)
        rows = chunk if suffix in MLP_PROJECTIONS else n  # the same FLOPs, fewer rows
        for kind, form in (("forward", "nt"), ("backward", "nn")):
            for (first, stop, group), resident_blocks in zip(groups, resident_in, strict=True):
                share = resident_blocks[suffix] / (stop - first)  # resident blocks never tile
                tiled, whole = forward_passes(group, suffix, skipped) if kind == "forward" \
                    else (group["tiled_backward"], group["whole_backward"])
                if kind == "forward" and suffix in ("gate_proj", "up_proj"):
                    tiled += mlp_output_passes(arch, width) * (
                        group["tiled_backward"] + group["whole_backward"])
                work.append((flops * tiled * (1 - share), rows, tile, form))
                work.append((flops * (tiled * share + whole), rows, out, form))
    forwards = passes["tiled_forward"] + passes["whole_forward"]
    backwards = passes["tiled_backward"] + passes["whole_backward"]
    work.append((_attention_flops(workload) * (forwards + 2.5 * backwards), n,
                 workload.seq_len, "nt"))
    # the head runs in vocabulary tiles, resident or not: MeBP's logits, then its gradient
    # sum; MeZO's logits twice
    head_flops = 2 * n * arch.vocab_size * arch.hidden_size
    head_tile = tile_rows(arch.vocab_size, arch.hidden_size, head_tile_bytes, e)
    work.append((head_flops, n, head_tile, "nt"))
    work.append((head_flops, n, head_tile, "nt" if workload.method == "mezo" else "nn"))
    return tuple(w for w in work if w[0] > 0)


def _decompress_work(workload: Workload, knobs: EngineKnobs, resident: frozenset[str],
                     skipped: str | None) -> tuple[float, float, float, float]:
    """Parameters decompressed per step in tiles (to the matmul dtype) and their calls (one
    per tile), and whole (shared blocks, to the storage dtype) and theirs (one per
    projection)."""
    arch = workload.arch
    # per block weight: its share of its group's block passes (a shared block is
    # decompressed once for its recompute and its backward), and the tiled passes the
    # skipped projection is not decompressed in (a recompute's, when unshared)
    width = mlp_intermediate_width(workload, knobs)
    y_passes = mlp_output_passes(arch, width)
    uses = tuple((first, stop, (passes["tiled_forward"] + passes["tiled_backward"]) /
                  (stop - first), passes["whole_backward"] / (stop - first),
                  recompute_tiles_spared(passes, skipped) / (stop - first),
                  y_passes * (passes["tiled_backward"] + passes["whole_backward"]) /
                  (stop - first))
                 for first, stop, passes in block_groups(workload, knobs))
    head_uses = LOSS_PASSES[workload.method]
    chunks = mlp_chunks(workload, knobs)  # each decompresses the MLP's tiles again
    return _decompressions(arch, resident, knobs.decompress_tile_bytes,
                           knobs.loss_vocab_tile_bytes, matmul_bytes(workload, knobs),
                           uses, head_uses, chunks, width, skipped)


@lru_cache(maxsize=MEMO_ENTRIES, typed=True)
def _decompressions(arch: Architecture, resident: frozenset[str], block_tile_bytes: int,
                    head_tile_bytes: int, e: int,
                    group_uses: tuple[tuple[int, int, float, float, float, float], ...],
                    head_uses: int, chunks: int, width: int, skipped: str | None = None
                    ) -> tuple[float, float, float, float]:
    """``group_uses``: per group of blocks first..stop-1, a block weight's tiled and whole
    decompressions, the tiled ones ``skipped`` is spared, and gate's and up's extra tiled
    ones making the MLP's output for a backward in column chunks."""
    tiles = _tiles_per_projection(arch, block_tile_bytes, e, width)
    tiled_params = tile_calls = whole_params = whole_calls = 0.0
    for name, count, suffix in frozen_weight_suffixes(arch):
        if name in resident:
            continue
        if suffix is None:  # the head, in vocabulary tiles
            tiled_params += count * head_uses
            tile_calls += head_uses * vocab_tiles(arch, head_tile_bytes, e)
            continue
        block = block_index(name)
        tiled_uses, whole_uses, spared, y_uses = next(
            (tiled, whole, spared, y) for first, stop, tiled, whole, spared, y in group_uses
            if first <= block < stop)
        if suffix == skipped:
            tiled_uses -= spared
        if suffix in ("gate_proj", "up_proj"):
            tiled_uses += y_uses
        uses = tiled_uses * (chunks if suffix in MLP_PROJECTIONS else 1)
        tiled_params += count * uses
        whole_params += count * whole_uses
        tile_calls += tiles[suffix] * uses
        whole_calls += whole_uses
    return tiled_params, tile_calls, whole_params, whole_calls


@lru_cache(maxsize=MEMO_ENTRIES)
def _tiles_per_projection(arch: Architecture, tile_bytes: int, e: int,
                          width: int | None = None) -> Mapping[str, int]:
    """Tiles each projection of a block is decompressed in (the MLP's in each of its
    intermediate-column chunks of ``width``, when chunked)."""
    tiles = {}
    for suffix, (rows, cols) in arch.projections().items():
        chunks = 1
        if suffix in MLP_PROJECTIONS and width is not None and width < arch.intermediate_size:
            chunks = math.ceil(arch.intermediate_size / width)
            rows, cols = _column_chunk_shape(arch, rows, cols, width)
        tiles[suffix] = chunks * math.ceil(rows / tile_rows(rows, cols, tile_bytes, e))
    return MappingProxyType(tiles)


def _column_chunk_shape(arch: Architecture, out: int, inp: int, width: int
                        ) -> tuple[int, int]:
    """An MLP projection's (out, in) in one chunk of ``width`` intermediate columns: gate
    and up output them, down takes them in."""
    if inp == arch.intermediate_size:
        return out, min(inp, width)
    return min(out, width), inp


def _traffic_bytes(workload: Workload, knobs: EngineKnobs, resident: frozenset[str],
                   skipped: str | None) -> float:
    """Activation traffic of the blocks, the logits' softmax passes, the LoRA branches
    (rank-r matmuls are bandwidth-bound) and the tiled projections' copies."""
    arch, n, e = workload.arch, workload.tokens, DTYPE_BYTES[workload.compute_dtype]
    em = matmul_bytes(workload, knobs)
    passes = pass_counts(workload, knobs)
    forwards = passes["tiled_forward"] + passes["whole_forward"]
    backwards = passes["tiled_backward"] + passes["whole_backward"]
    block = n * saved_bytes_per_token(workload, knobs) * ELEMENTWISE_PASSES
    # MeBP's loss and its gradient come from one pass over the vocabulary; MeZO's two
    # forwards each make their own loss
    logits = n * arch.vocab_size * (4 * 6 + e) * (2 if workload.method == "mezo" else 1)
    lora_forward, lora_backward = _lora_traffic(workload, knobs.lora_hidden)
    traffic = (forwards + 2 * backwards) * block + logits + forwards * lora_forward + \
        backwards * lora_backward
    every, _, tail = pass_knobs(workload, knobs)
    if workload.method == "mebp" and knobs.checkpoint_storage == "mmap" and every != "none":
        # copied into the mapping in the forward, copied out again in the backward
        saved = math.ceil((arch.num_layers - tail) / every)
        traffic += 4 * saved * n * arch.hidden_size * e
    groups = block_groups(workload, knobs)
    resident_in = [_resident_blocks(workload, resident, first, stop)
                   for first, stop, _ in groups]
    width = mlp_intermediate_width(workload, knobs)
    tiles = _tiles_per_projection(arch, knobs.decompress_tile_bytes, em, width)
    for suffix, (out, inp) in arch.projections().items():
        if suffix in MLP_PROJECTIONS:  # down's partial input gradient: a chunk's columns
            inp = _column_chunk_shape(arch, out, inp, width)[1]
        for (first, stop, group), resident_blocks in zip(groups, resident_in, strict=True):
            lazy = 1 - resident_blocks[suffix] / (stop - first)
            # a forward tile's output is copied into its columns; a backward tile's partial
            # input gradient is added into the whole
            traffic += lazy * forward_passes(group, suffix, skipped)[0] * n * out * e * 2
            traffic += lazy * group["tiled_backward"] * tiles[suffix] * n * inp * e * 3
    if em != e:
        traffic += _upcast_bytes(workload, knobs, resident, e, em, skipped)
    return traffic


@lru_cache(maxsize=256)
def _lora_traffic(workload: Workload, lora_hidden: str) -> tuple[int, int]:
    """Bytes the LoRA branches move in a block's forward and in its backward."""
    n, e = workload.tokens, DTYPE_BYTES[workload.compute_dtype]
    adapted = adapted_projections(workload).values()
    forward = sum(n * (inp + out) * e for out, inp in adapted)
    # the backward reads x and the output gradient for A's, B's and x's gradients, and x once
    # more to recompute h = xA unless it was kept
    backward = 3 * forward - (sum(n * inp * e for _, inp in adapted)
                              if lora_hidden == "store" else 0)
    return forward, backward


def _upcast_bytes(workload: Workload, knobs: EngineKnobs, resident: frozenset[str], e: int,
                  em: int, skipped: str | None) -> float:
    """Bytes read and written upcasting held weights to the matmul dtype, a tile at a time:
    shared block weights at their recompute and backward, resident ones at every use (the
    skipped projection's recompute uses neither)."""
    kinds = ("tiled_forward", "whole_forward", "tiled_backward", "whole_backward")
    uses = tuple((first, stop,
                  (passes["whole_forward"] + passes["whole_backward"]) / (stop - first),
                  sum(passes[k] for k in kinds) / (stop - first),
                  passes["recompute"] / (stop - first))
                 for first, stop, passes in block_groups(workload, knobs))
    chunks = mlp_chunks(workload, knobs)  # each upcasts the MLP's tiles again
    return _upcast_params(workload.arch, resident, uses, chunks, skipped) * (e + em)


@lru_cache(maxsize=MEMO_ENTRIES, typed=True)
def _upcast_params(arch: Architecture, resident: frozenset[str],
                   group_uses: tuple[tuple[int, int, float, float, float], ...], chunks: int,
                   skipped: str | None = None) -> float:
    """``group_uses``: per group of blocks first..stop-1, a block weight's uses held whole
    (shared) and its uses in all, and its recomputes (which skip ``skipped``)."""
    params = 0.0
    for name, count, suffix in frozen_weight_suffixes(arch):
        per_use = chunks if suffix in MLP_PROJECTIONS else 1
        block = block_index(name)
        shared_uses, all_uses, recomputes = next(
            ((shared, every, recompute) for first, stop, shared, every, recompute
             in group_uses if first <= block < stop), (0.0, 0.0, 0.0))
        if suffix == skipped:
            all_uses -= recomputes
            shared_uses -= recomputes if shared_uses else 0.0
        if name in resident:
            params += count * (all_uses * per_use if suffix is not None else 1)
        elif suffix is not None:
            params += count * shared_uses * per_use
    return params

