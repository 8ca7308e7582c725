"""The planner's grid: every configuration of a method's knobs that a plan prices."""

from __future__ import annotations

import itertools
import math

from mebp_core.config import BACKPROP_KNOBS, EngineKnobs
from mebp_core.plan.weight_memory import resident_within
from mebp_core.plan.workload import DTYPE_BYTES, Workload

SMALL_TILE_BYTES = 1 << 20
# MLP chunks the grid tries (each only below the batch's tokens): a quarter of a seq-256
# batch, where the (tokens, intermediate) tensors stop dominating a block's backward
MLP_CHUNK_TOKENS = (64,)
# graph tails the grid tries: every length short of the whole model, or this many evenly
# spaced in a deeper one (a tail's memory and time move a block at a time: on qwen2.5-0.5b
# at seq 256 in native bfloat16, 14 MB and one block's recompute each)
GRAPH_TAILS = 24


def candidate_knobs(workload: Workload, threads: int | None = None,
                    bf16_matmul: str = "auto") -> list[EngineKnobs]:
    """The grid of ``workload.method``'s knobs. MeBP: weights lazy, resident to a quarter,
    half, three quarters, or all; checkpoints every 1, 2, 4 blocks or none, in RAM or a file;
    LoRA h kept or not; one decompression per block or two; default or small tiles; the
    backward's MLP whole, in chunks of tokens or of intermediate columns; and between
    checkpointing every block and none, graph tails of ``GRAPH_TAILS`` lengths (with every
    block's input checkpointed in RAM before them, shared decompression and default tiles:
    the fast configurations, which the tail's memory is traded against); and without
    checkpoints, the first k blocks resident for each k. MeZO (forwards
    only): the weights, the tiles and the MLP's chunks. Each with the store mapped and, where
    it reads the store, read directly. Plain backprop: its one configuration."""
    run = {"bf16_matmul": bf16_matmul, "threads": threads}
    if workload.method == "backprop":
        return [EngineKnobs(**BACKPROP_KNOBS, **run)]
    arch = workload.arch
    e = DTYPE_BYTES[workload.compute_dtype]
    weights = frozen_weight_choices(workload)
    tiles_and_chunks = list(itertools.product((8 << 20, SMALL_TILE_BYTES),
                                              [{}, *mlp_chunk_choices(workload)]))
    if workload.method == "mezo":
        return with_direct_reads([
            EngineKnobs(frozen_weights=frozen, resident_weight_bytes=budget,
                        decompress_tile_bytes=tile, loss_vocab_tile_bytes=tile, **chunk, **run)
            for (frozen, budget), (tile, chunk) in itertools.product(weights, tiles_and_chunks)
            if not (frozen == "resident" and budget is None and tile != 8 << 20)])
    checkpoint_blocks = [1, 2, 4, "none"]
    out = []
    for (frozen, budget), every, storage, hidden, shared, (tile, chunk) in itertools.product(
            weights, checkpoint_blocks, ("ram", "mmap"), ("recompute", "store"),
            (True, False), tiles_and_chunks):
        if every == "none" and (storage == "mmap" or not shared or chunk):
            continue  # none of these applies without checkpoints
        if shared and "mlp_intermediate_chunk" in chunk:
            continue  # its point is to decompress a chunk's columns, never a whole weight
        if frozen == "resident" and budget is None and (not shared or tile != 8 << 20):
            continue  # nothing is decompressed per step
        out.append(EngineKnobs(frozen_weights=frozen, resident_weight_bytes=budget,
                               checkpoint_blocks=every, checkpoint_storage=storage,
                               lora_hidden=hidden, share_decompression=shared,
                               decompress_tile_bytes=tile, loss_vocab_tile_bytes=tile,
                               **chunk, **run))
    out += [EngineKnobs(frozen_weights=frozen, resident_weight_bytes=budget,
                        graph_tail_blocks=tail, lora_hidden=hidden, share_decompression=True,
                        **run)
            for (frozen, budget), tail, hidden in itertools.product(
                weights, graph_tails(arch.num_layers), ("recompute", "store"))]
    # past the no-checkpoint step only resident weights are left to buy: there, the first
    # k blocks' (the quarters above leave holes of a quarter of the weights in the front),
    # but where a quarter keeps the same weights
    block = arch.block_params() * e
    kept_by_quarters = {resident_within(arch, budget, e).names for frozen, budget in weights
                        if frozen == "resident"}
    out += [EngineKnobs(frozen_weights="resident", resident_weight_bytes=blocks * block,
                        checkpoint_blocks="none", lora_hidden=hidden,
                        share_decompression=True, **run)
            for blocks, hidden in itertools.product(resident_block_counts(arch.num_layers),
                                                    ("recompute", "store"))
            if resident_within(arch, blocks * block, e).names not in kept_by_quarters]
    return with_direct_reads(out)


def with_direct_reads(grid: list[EngineKnobs]) -> list[EngineKnobs]:
    """``grid`` and, for each configuration that reads weights from the store, its twin
    reading them directly (``store_reads``): what a cap with no room for the store's pages
    beside the step is priced against. Not where checkpoints are every K > 1 blocks: each
    segment's blocks are re-run forward, then back, and the reader's guess of the next block
    (onward, or back at either end) misses at every turn (unpriced)."""
    return grid + [knobs.model_copy(update={"store_reads": "direct"}) for knobs in grid
                   if not (knobs.frozen_weights == "resident"
                           and knobs.resident_weight_bytes is None)
                   and knobs.checkpoint_blocks in (1, "none")]


def frozen_weight_choices(workload: Workload) -> list[tuple[str, int | None]]:
    """(frozen_weights, resident_weight_bytes) of every configuration but the no-checkpoint
    step's resident blocks: lazy, resident to a quarter, half or three quarters of the
    weights' bytes (rounded to whole KB: the configuration ids stay short and exact), all."""
    total = sum(params for _, params in workload.arch.frozen_weights()) * \
        DTYPE_BYTES[workload.compute_dtype]
    return [("lazy", None),
            *[("resident", int(total * f) >> 10 << 10) for f in (0.25, 0.5, 0.75)],
            ("resident", None)]


def resident_block_counts(layers: int) -> list[int]:
    """How many of the first blocks the no-checkpoint step's grid keeps resident: the graph
    tails' lengths and every block (not the head, which goes last)."""
    return sorted({*graph_tails(layers), layers})


def mlp_chunk_choices(workload: Workload) -> list[dict[str, int]]:
    """The MLP's chunks the grid tries: where a block can run its MLP by intermediate
    columns, the columns that keep about the (tokens, intermediate) tensors of each of
    ``MLP_CHUNK_TOKENS`` over every token, in equal chunks where a width near that divides
    the intermediate size; those tokens where no column width does (Gemma 3, which norms
    its MLP's output: its backward would make that output first, priced but not measured
    against the kernel), where the columns would be much wider than that, or where the
    batch has more tokens than the MLP intermediate columns.

    Why columns replace tokens where they can: a column chunk decompresses each weight once
    per pass where a token chunk decompresses all of them once per chunk, and the kernel
    counts the two alike (qwen2.5-0.5b, seq 256, bf16, tiles of 1 MB: 64 tokens 75.5 MB
    above the imports, 1216 columns 73-75 MB, at 2.7 s and 1.6 s a step on an AMX Xeon).
    Why equal chunks: a narrower last chunk costs the kernel 6-14 MB more than the planner
    counts (widths 192, 576, 1280 against 128, 1216; BENCHMARKS, "MLP column chunks of
    equal width"). Why not narrower slices to fit the small tile: each chunk's ops cost
    about a millisecond of dispatch the time model does not see (576 columns ran 2.1 s
    against 1216's 1.6 s, for no memory the kernel counts). Widths are multiples of 64
    and of the quantization group (a chunk's columns of down are whole groups)."""
    arch = workload.arch
    by_columns = arch.residual_output_projection is not None
    step = math.lcm(64, workload.group_size)
    choices = []
    for tokens in MLP_CHUNK_TOKENS:
        if tokens >= workload.tokens:
            continue
        target = arch.intermediate_size * tokens / workload.tokens
        width = _column_chunk_width(arch.intermediate_size, target, step) if by_columns \
            else None
        if width is not None:
            choices.append({"mlp_intermediate_chunk": width})
        # token chunks where columns cannot hold about the same tensors, or where the
        # float32 (tokens, hidden) sums the columns keep beside a chunk outgrow it (more
        # tokens than intermediate columns): the smaller peak there
        if width is None or width > 1.5 * target or workload.tokens > arch.intermediate_size:
            choices.append({"mlp_chunk_tokens": tokens})
    return choices


def _column_chunk_width(intermediate: int, target: float, step: int) -> int | None:
    """The multiple of ``step`` below ``intermediate`` that divides it evenly, nearest to
    ``target`` (the wider of two as near: fewer chunks, whose ops the time model
    under-prices) between a third of it and half as much again (wider chunks hold wider
    tensors); where none is, ``target`` rounded up to a multiple of ``step`` (a narrower
    last chunk); None where that spans every column."""
    equal = [w for w in range(step, intermediate, step)
             if intermediate % w == 0 and target / 3 <= w <= 1.5 * target]
    if equal:
        return min(equal, key=lambda w: (abs(w - target), -w))
    rounded = math.ceil(target / step) * step
    return rounded if rounded < intermediate else None


def graph_tails(layers: int) -> range:
    """The graph tails the grid tries: from 1 block, evenly spaced, short of the whole model
    (a tail of every block is checkpoint_blocks none)."""
    return range(1, layers, max(1, math.ceil((layers - 1) / GRAPH_TAILS)))
