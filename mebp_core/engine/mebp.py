"""The MeBP step: forward keeping only block inputs, backward block by block in reverse.

With the default knobs, memory at any moment is the checkpoints (one (B, T, D) tensor per
block), one block's recomputed activations, at most one block's decompressed weights, and
the LoRA parameters.
The gradients are exactly those of plain autograd over the same model.

The ``checkpoint_blocks`` knob trades this: with k > 1 only every k-th block input is saved
and the backward re-runs each segment's forward from it (keeping that segment's k inputs
meanwhile); with "none" one autograd graph spans the model, no block recomputed.
``graph_tail_blocks`` K keeps the last K blocks in one autograd graph (their activations
kept, never recomputed) and checkpoints the blocks before them: the two, a block at a time.
A graph that chains blocks keeps each MLP's gate and up outputs alone; the activation and
the product are recomputed from them in its backward (``gated_mlp``); plain backprop's
(``full_logits``) keeps all four, as a plain trainer's does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mebp_core.engine.backward import backward_from
from mebp_core.engine.frozen import FrozenLinear
from mebp_core.engine.gated_mlp import run_chained_block
from mebp_core.engine.loss import (
    IGNORE_INDEX,
    compute_full_logits_loss,
    compute_head_loss,
    iter_vocab_tiles,
)
from mebp_core.engine.mlp_chunks import (
    backward_block_by_columns,
    column_chunk_width,
    run_mlp_by_columns,
)
from mebp_core.engine.model import EngineModel
from mebp_core.models.base import apply_softcap


@dataclass
class StepLoss:
    loss_sum: float  # summed over the valid target tokens of the batch
    valid_tokens: int
    correct_tokens: int


def shift_targets(labels: torch.Tensor) -> torch.Tensor:
    """Next-token targets in transformers' convention: position t predicts labels[t + 1]."""
    targets = torch.full_like(labels, IGNORE_INDEX)
    targets[:, :-1] = labels[:, 1:]
    return targets  # (B, T)


def count_valid_targets(labels: torch.Tensor) -> int:
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def forward_blocks(engine: EngineModel, input_ids: torch.Tensor, checkpoints=None,
                   every: int = 1, stop: int | None = None) -> torch.Tensor:
    """Run the frozen forward without autograd through the blocks before ``stop`` (all of
    them by default), saving the input of every ``every``-th block (in checkpoint slot
    ``index // every``) if asked."""
    ctx = engine.context(input_ids.shape[1])
    layers = engine.layers[:stop]
    with torch.no_grad():
        hidden = engine.arch.embed(input_ids).to(engine.dtype)  # (B, T, D)
        if checkpoints is not None:
            checkpoints.reserve(-(-len(layers) // every), hidden)
        for index, layer in enumerate(layers):
            if checkpoints is not None and index % every == 0:
                checkpoints.put(index // every, hidden)
            hidden = run_block(engine, layer, hidden, ctx)
    return hidden


def run_block(engine: EngineModel, block, hidden: torch.Tensor, ctx) -> torch.Tensor:
    """One block's forward without autograd, its MLP part ``mlp_chunk_tokens`` tokens or
    ``mlp_intermediate_chunk`` intermediate columns at a time if asked (so no (tokens,
    intermediate) tensor is made)."""
    columns = column_chunk_width(block.mlp, engine.knobs.mlp_intermediate_chunk)
    if columns is not None:
        middle = block.attention_part(hidden, ctx)
        return block.mlp_output(middle, run_mlp_by_columns(block.mlp, block.mlp_input(middle),
                                                           columns))
    chunks = _mlp_row_chunks(engine, hidden)
    if chunks is None:
        return block(hidden, ctx)
    middle = block.attention_part(hidden, ctx)
    flat = middle.view(-1, middle.shape[-1])
    for rows in chunks:
        flat[rows] = block.mlp_part(flat[rows])  # each row depends on its own input only
    return middle


def _mlp_row_chunks(engine: EngineModel, hidden: torch.Tensor) -> list[slice] | None:
    """The token rows of each MLP pass over ``hidden`` (..., D), or None: the block whole."""
    chunk = engine.knobs.mlp_chunk_tokens
    n_tokens = hidden.numel() // hidden.shape[-1]
    if chunk is None or chunk >= n_tokens:
        return None
    return [slice(start, start + chunk) for start in range(0, n_tokens, chunk)]


def evaluate_batch(engine: EngineModel, input_ids: torch.Tensor,
                   labels: torch.Tensor) -> StepLoss:
    """Loss and next-token accuracy of a batch, with no gradients and no logits tensor."""
    hidden = forward_blocks(engine, input_ids)
    with torch.no_grad():
        normed = engine.arch.final_norm(hidden)
    head = _head_loss(engine, normed, labels, with_grad=False)
    return StepLoss(float(head.loss_sum), head.valid_tokens, head.correct_tokens)


def compute_logits(engine: EngineModel, input_ids: torch.Tensor) -> torch.Tensor:
    """Full (B, T, V) float32 logits, the head decompressed tile by tile (for small inputs:
    the training path never builds this tensor)."""
    hidden = forward_blocks(engine, input_ids)
    head = engine.arch.head_weight_name
    with torch.no_grad():
        normed = engine.arch.final_norm(hidden)
        logits = torch.empty(*normed.shape[:-1], engine.store.info(head).shape[0])
        normed = normed.to(engine.matmul_dtype)
        for start, weight in iter_vocab_tiles(engine.store, head, engine.matmul_dtype,
                                              engine.knobs.loss_vocab_tile_bytes,
                                              engine.working_set):
            logits[..., start : start + weight.shape[0]] = (normed @ weight.T).float()
        return apply_softcap(logits, engine.arch.logit_softcap)


def run_mebp_step(engine: EngineModel, input_ids: torch.Tensor, labels: torch.Tensor,
                  checkpoints, *, loss_scale: float,
                  on_block_done: Callable[[int], None] | None = None,
                  full_logits: bool = False) -> StepLoss:
    """Accumulate ``loss_scale * d(sum of token losses)/d(LoRA)`` into the LoRA ``.grad``s.

    ``on_block_done(i)`` runs right after block i's gradients are complete: an optimizer may
    update that block there, since no later backward reads its parameters.

    ``full_logits``: the loss from the whole (N, V) logits inside the one autograd graph,
    as plain backprop computes it (the same gradients; it needs ``checkpoint_blocks`` none).
    """
    every = engine.knobs.checkpoint_blocks
    if full_logits and every != "none":
        raise ValueError("full logits are plain backprop's: they need checkpoint_blocks none")
    n_blocks = len(engine.layers)
    # the blocks before ``first_tail`` are checkpointed, the rest run in one autograd graph
    first_tail = 0 if every == "none" else \
        n_blocks - min(engine.knobs.graph_tail_blocks, n_blocks)
    if first_tail == 0:
        return _run_whole_graph_step(engine, input_ids, labels, loss_scale, on_block_done,
                                     full_logits)
    ctx = engine.context(input_ids.shape[1])
    try:
        hidden = forward_blocks(engine, input_ids, checkpoints, every, stop=first_tail)
        grad, head = _tail_backward(engine, hidden, labels, loss_scale, first_tail, ctx,
                                    on_block_done)
        del hidden
        if engine.shares_decompression:  # the backward decompresses whole projections
            engine.working_set.release_buffers(shared=False)
        for first in reversed(range(0, first_tail, every)):
            inputs = _segment_inputs(engine, checkpoints.pop(first // every), first,
                                     min(first + every, first_tail), ctx)
            for index in reversed(range(first, first + len(inputs))):
                block_input = inputs.pop().requires_grad_(True)
                with torch.enable_grad(), _weight_sharing(engine):
                    _block_backward(engine, engine.layers[index], block_input, grad, ctx)
                grad = block_input.grad
                del block_input
                if on_block_done is not None:
                    on_block_done(index)
    finally:
        checkpoints.clear()
        engine.working_set.release_buffers(tiles=False)  # no block-sized buffer outside backward
    return StepLoss(float(head.loss_sum), head.valid_tokens, head.correct_tokens)


def _tail_backward(engine: EngineModel, hidden: torch.Tensor, labels: torch.Tensor,
                   loss_scale: float, first: int, ctx,
                   on_block_done: Callable[[int], None] | None):
    """The blocks from ``first`` on, run forward under one autograd graph from ``hidden``
    (their input), the head's loss and the backward through them: the gradient w.r.t.
    ``hidden``, and the head's loss. No tail (``first`` past the last block): the head's
    alone."""
    tail_input = hidden.requires_grad_(True) if first < len(engine.layers) else hidden
    with torch.enable_grad():
        for layer in engine.layers[first:]:
            hidden = run_chained_block(layer, hidden, ctx)
    head, grad = _head_backward(engine, hidden, labels, loss_scale)
    if hidden is tail_input:
        return grad, head
    backward_from(hidden, grad)
    del hidden, grad
    if on_block_done is not None:
        for index in reversed(range(first, len(engine.layers))):
            on_block_done(index)
    return tail_input.grad, head


def _block_backward(engine: EngineModel, block, block_input: torch.Tensor,
                    grad: torch.Tensor, ctx) -> None:
    """Recompute one block from its input under autograd and run its backward, the MLP part
    ``mlp_chunk_tokens`` tokens or ``mlp_intermediate_chunk`` columns at a time if asked (the
    same sums, in a different order)."""
    with _residual_output_unused(block):
        _recompute_and_backward(engine, block, block_input, grad, ctx)


@contextlib.contextmanager
def _residual_output_unused(block):
    """The recompute of ``block`` does not multiply the projection whose output only enters
    the block's output sum: its backward never reads that output (nor, then, the sum), so
    the gradients are the same bits for one product (and, unshared, its tiles) less."""
    projection = block.residual_output_projection()
    frozen = getattr(projection, "base", projection)  # under a LoRA branch, or bare
    if not isinstance(frozen, FrozenLinear):
        yield
        return
    frozen.output_unused = True
    try:
        yield
    finally:
        frozen.output_unused = False


def _recompute_and_backward(engine: EngineModel, block, block_input: torch.Tensor,
                            grad: torch.Tensor, ctx) -> None:
    columns = column_chunk_width(block.mlp, engine.knobs.mlp_intermediate_chunk)
    if columns is not None:  # down's product is skipped there whatever the block
        backward_block_by_columns(block, block_input, grad, ctx, columns)
        return
    chunks = _mlp_row_chunks(engine, grad)
    if chunks is None:
        backward_from(block(block_input, ctx), grad)
        return
    middle = block.attention_part(block_input, ctx)  # (B, T, D), its graph kept
    flat_middle = middle.detach().view(-1, middle.shape[-1])
    flat_grad = grad.reshape(-1, grad.shape[-1])
    grad_middle = torch.empty_like(flat_middle)
    with engine.working_set.reuse_shared():
        for rows in chunks:
            x = flat_middle[rows].requires_grad_(True)
            backward_from(block.mlp_part(x), flat_grad[rows])
            grad_middle[rows] = x.grad
            del x
    backward_from(middle, grad_middle.view_as(middle))


def _segment_inputs(engine: EngineModel, first_input: torch.Tensor, first: int, stop: int,
                    ctx) -> list[torch.Tensor]:
    """The inputs of blocks first..stop-1, re-running the segment's forward from its
    checkpoint (nothing to re-run when every block was saved)."""
    inputs = [first_input]
    with torch.no_grad():
        for index in range(first, stop - 1):
            inputs.append(run_block(engine, engine.layers[index], inputs[-1], ctx))
    if len(inputs) > 1 and engine.shares_decompression:
        engine.working_set.release_buffers(shared=False)  # the backward needs no tiles
    return inputs


def _run_whole_graph_step(engine: EngineModel, input_ids: torch.Tensor, labels: torch.Tensor,
                          loss_scale: float, on_block_done: Callable[[int], None] | None,
                          full_logits: bool) -> StepLoss:
    """No checkpoints: one autograd graph over every block, no block recomputed (only each
    MLP's activation and product, elementwise, unless ``full_logits``: plain backprop's graph
    keeps every activation). Lazy frozen weights are decompressed again, tile by tile, by
    their backward."""
    ctx = engine.context(input_ids.shape[1])
    with torch.enable_grad():
        hidden = engine.arch.embed(input_ids).to(engine.dtype)  # (B, T, D)
        for layer in engine.layers:
            if full_logits:  # plain backprop's graph is a plain trainer's
                hidden = layer(hidden, ctx)
            else:
                hidden = run_chained_block(layer, hidden, ctx)
    if full_logits:
        step = _full_logits_backward(engine, hidden, labels, loss_scale)
    else:
        head, grad = _head_backward(engine, hidden, labels, loss_scale)
        backward_from(hidden, grad)
        del grad
        step = StepLoss(float(head.loss_sum), head.valid_tokens, head.correct_tokens)
    del hidden
    if on_block_done is not None:
        for index in reversed(range(len(engine.layers))):
            on_block_done(index)
    return step


def _full_logits_backward(engine: EngineModel, hidden: torch.Tensor, labels: torch.Tensor,
                          loss_scale: float) -> StepLoss:
    with torch.enable_grad():
        normed = engine.arch.final_norm(hidden)
        loss_sum, valid, correct = compute_full_logits_loss(
            normed.reshape(-1, normed.shape[-1]), shift_targets(labels).reshape(-1),
            _head_weight(engine), engine.arch.logit_softcap)
        (loss_sum * loss_scale).backward()
    return StepLoss(float(loss_sum.detach()), valid, correct)


def _head_weight(engine: EngineModel) -> torch.Tensor:
    """The head, (V, D): resident, or on a lazy engine decompressed once for the step."""
    name = engine.arch.head_weight_name
    resident = engine.working_set.resident.get(name)
    if resident is not None:
        return resident
    return engine.store.dequantize(name, engine.dtype)


def _head_backward(engine: EngineModel, hidden: torch.Tensor, labels: torch.Tensor,
                   loss_scale: float):
    """The head loss of the last block's output and the gradient w.r.t. that output."""
    last = hidden.detach().requires_grad_(True)
    with torch.enable_grad():
        normed = engine.arch.final_norm(last)
    head = _head_loss(engine, normed.detach(), labels, with_grad=True)
    grad_normed = (head.grad_hidden * loss_scale).to(normed.dtype).view_as(normed)
    backward_from(normed, grad_normed)
    head.grad_hidden = None
    return head, last.grad


def _weight_sharing(engine: EngineModel):
    if engine.shares_decompression:
        return engine.working_set.share_weights()
    return contextlib.nullcontext()


def _head_loss(engine: EngineModel, normed: torch.Tensor, labels: torch.Tensor, *,
               with_grad: bool):
    targets = shift_targets(labels).reshape(-1)
    return compute_head_loss(
        normed.reshape(-1, normed.shape[-1]), targets,
        store=engine.store, head_name=engine.arch.head_weight_name,
        dtype=engine.matmul_dtype,
        tile_bytes=engine.knobs.loss_vocab_tile_bytes,
        softcap=engine.arch.logit_softcap,
        working_set=engine.working_set, with_grad=with_grad)
