"""A block's MLP over every token, ``mlp_intermediate_chunk`` columns of its intermediate
dimension at a time (the ``mlp_intermediate_chunk`` knob).

For a column block c: ``a_c = act(x Wg[c]^T) * (x Wu[c]^T)`` and ``y = sum_c a_c Wd[:, c]^T``
(each LoRA branch sliced alike: B's rows c for gate and up, A's columns c for down). No
(tokens, intermediate) tensor is wider than a chunk, and each MLP weight is decompressed once
per pass (gate and up a row slice per chunk, down a column slice). The backward of
y = sum_c y_c runs chunk by chunk from the same dL/dy: the summed contributions are the exact
gradients, in another summation order (summed in float32).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from mebp_core.engine.backward import backward_from, backward_from_parts
from mebp_core.engine.frozen_slices import WeightSlice, add_slice_product, multiply_slice
from mebp_core.lora.linear import LoraLinear


def column_chunks(intermediate_size: int, chunk: int) -> list[slice]:
    """The intermediate columns of each pass, the last one narrower if ``chunk`` does not
    divide the width."""
    return [slice(start, min(start + chunk, intermediate_size))
            for start in range(0, intermediate_size, chunk)]


def column_chunk_width(mlp: nn.Module, chunk: int | None) -> int | None:
    """``chunk``, or None (the MLP untiled) when unset or one chunk would span every column:
    the planner prices that as untiled."""
    if chunk is None or chunk >= _frozen(mlp.gate_proj).out_features:
        return None
    return chunk


def run_mlp_by_columns(mlp: nn.Module, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """``mlp(x)`` for x (..., D) without autograd, summed over column chunks in float32."""
    flat = x.reshape(-1, x.shape[-1])  # (N, D)
    y = torch.zeros(flat.shape[0], _frozen(mlp.down_proj).out_features)  # (N, D) float32
    working_set = _frozen(mlp.down_proj).working_set
    for cols in column_chunks(_frozen(mlp.gate_proj).out_features, chunk):
        with working_set.chunk_scope():
            _add_chunk_output(y, mlp, flat, cols)
    y = y.to(x.dtype)
    bias = _frozen(mlp.down_proj).bias
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], -1)


def backward_block_by_columns(block, block_input: torch.Tensor, grad: torch.Tensor, ctx,
                              chunk: int) -> None:
    """Recompute ``block`` from its input and run its backward (into ``block_input.grad`` and
    the LoRA ``.grad``s), the MLP a column chunk at a time."""
    middle = block.attention_part(block_input, ctx)  # (B, T, D), its graph kept
    h = middle.detach().requires_grad_(True)
    x = block.mlp_input(h)  # (B, T, D), its graph kept
    x_flat = x.detach().view(-1, x.shape[-1])  # (N, D)
    if block.residual_output_projection() is None:  # the output sum reads y: make it
        with torch.no_grad():
            y = run_mlp_by_columns(block.mlp, x_flat, chunk).view_as(h)
    else:  # y enters the sum only: its backward never reads it
        y = torch.zeros((), dtype=h.dtype).expand(h.shape)
    y.requires_grad_(True)
    backward_from(block.mlp_output(h, y), grad)
    grad_y = y.grad.view(-1, y.shape[-1])  # (N, D)
    del y
    grad_x = _mlp_input_grad(block.mlp, x_flat, grad_y, chunk)
    backward_from(x, grad_x.view_as(x))  # into h.grad, beside the residual's
    del grad_x, grad_y
    backward_from(middle, h.grad)


def _mlp_input_grad(mlp: nn.Module, x_flat: torch.Tensor, grad_y: torch.Tensor,
                    chunk: int) -> torch.Tensor:
    """dL/dx of the MLP, summed over the chunks in float32, the LoRA ``.grad``s accumulated;
    a shared engine keeps a chunk's gate and up slices from its forward to its backward."""
    working_set = _frozen(mlp.gate_proj).working_set
    hold = working_set.shared is not None
    grad_x = torch.zeros(x_flat.shape, dtype=torch.float32)  # (N, D)
    down = mlp.down_proj
    for cols in column_chunks(_frozen(mlp.gate_proj).out_features, chunk):
        with working_set.chunk_scope(), _held_slices(mlp, cols, hold) as held:
            x_c = x_flat.detach().requires_grad_(True)
            # the frozen slices add their input gradients into grad_x themselves (unrounded)
            a = _chunk_activation(mlp, x_c, cols, held, grad_into=grad_x)  # (N, |c|)
            # the chunk's output is never read, only its backward: down's product is skipped
            # (an expanded zero) and each part is handed dL/dy, no (N, D) sum made
            parts = [multiply_slice(a, WeightSlice(_frozen(down), cols=cols),
                                    skip_output=True)]
            if isinstance(down, LoraLinear):
                parts.append(down.delta(a, cols=cols))
            del a
            backward_from_parts(parts, grad_y)
            del parts
            if x_c.grad is not None:  # the gate and up LoRA branches' share
                grad_x += x_c.grad
            del x_c
    return grad_x.to(x_flat.dtype)


def _add_chunk_output(y: torch.Tensor, mlp: nn.Module, x: torch.Tensor, cols: slice) -> None:
    """``y += a_c Wd[:, c]^T`` (+ LoRA) for x (N, D), y (N, D) float32, without down's bias:
    in place, the frozen product in the matmul dtype, one (N, D) partial alive at most."""
    a = _chunk_activation(mlp, x, cols)  # (N, |c|)
    down = mlp.down_proj
    add_slice_product(y, a, WeightSlice(_frozen(down), cols=cols))
    if isinstance(down, LoraLinear):
        y.add_(down.delta(a, cols=cols))


def _chunk_activation(mlp: nn.Module, x: torch.Tensor, cols: slice, held=None,
                      grad_into: torch.Tensor | None = None) -> torch.Tensor:
    """``a_c = act(x Wg[c]^T) * (x Wu[c]^T)`` (+ LoRA) for x (N, D): (N, |c|)."""
    gate_slice, up_slice = held or (None, None)
    gate = _rows_output(mlp.gate_proj, x, cols, gate_slice, grad_into)  # (N, |c|)
    up = _rows_output(mlp.up_proj, x, cols, up_slice, grad_into)
    return mlp.act_fn(gate) * up


def _rows_output(projection: nn.Module, x: torch.Tensor, rows: slice,
                 weight: WeightSlice | None, grad_into: torch.Tensor | None) -> torch.Tensor:
    frozen = _frozen(projection)
    y = multiply_slice(x, weight or WeightSlice(frozen, rows=rows), grad_into=grad_into)
    if frozen.bias is not None:
        y = y + frozen.bias[rows]
    if isinstance(projection, LoraLinear):
        y = y + projection.delta(x, rows=rows)
    return y


@contextlib.contextmanager
def _held_slices(mlp: nn.Module, cols: slice, hold: bool):
    """The gate and up row slices of a chunk, held from its forward to its backward if
    ``hold``, dropped when the chunk is done."""
    if not hold:
        yield None
        return
    held = (WeightSlice(_frozen(mlp.gate_proj), rows=cols, hold=True),
            WeightSlice(_frozen(mlp.up_proj), rows=cols, hold=True))
    try:
        yield held
    finally:
        for weight in held:
            weight.release()


def _frozen(projection: nn.Module):
    return projection.base if isinstance(projection, LoraLinear) else projection
