"""A frozen projection multiplied by a slice of its weight: some of its rows (``x W[rows]^T``,
some outputs) or some of its columns (``x_c W[:, cols]^T``, the whole output from some inputs).

Like ``FrozenLinear``'s own matmul it saves no weight for backward: a lazy slice is
decompressed again there, unless held for one MLP column chunk (``hold``: the chunk's
forward and backward then share one decompression). A resident weight is used in place
(or upcast a slice at a time). The slice is the unit of decompression: its bytes, not
``decompress_tile_bytes``, bound it, and every decompression is counted live until dropped.
"""

from __future__ import annotations

import torch

from mebp_core.engine.frozen import FrozenLinear


class WeightSlice:
    """Rows or columns of ``layer``'s weight in its matmul dtype, made when a matmul needs
    them; with ``hold`` made once and kept until ``release``."""

    def __init__(self, layer: FrozenLinear, *, rows: slice | None = None,
                 cols: slice | None = None, hold: bool = False) -> None:
        self.layer, self.rows, self.cols, self.hold = layer, rows, cols, hold
        self._held: torch.Tensor | None = None

    def take(self) -> torch.Tensor:
        if self._held is not None:
            return self._held
        layer = self.layer
        working_set = layer.working_set
        resident = working_set.resident.get(layer.weight_name)
        if resident is not None:
            view = resident[self.rows or slice(None)]
            view = view if self.cols is None else view[:, self.cols]
            if resident.dtype == layer.matmul_dtype:
                return view  # counted live as resident already
            return working_set.upcast(view, layer.matmul_dtype, layer.block)
        tile = working_set.decompress(layer.store, layer.weight_name, layer.matmul_dtype,
                                      rows=self.rows, cols=self.cols, block=layer.block)
        if self.hold:
            self._held = tile
        return tile

    def give_back(self, tile: torch.Tensor) -> None:
        """Done with ``tile`` for now: dropped unless held or a resident view."""
        if tile is self._held:
            return
        resident = self.layer.working_set.resident.get(self.layer.weight_name)
        if resident is None or resident.dtype != self.layer.matmul_dtype:
            self.layer.drop(tile)

    def release(self) -> None:
        if self._held is not None:
            self.layer.drop(self._held)
            self._held = None


def multiply_slice(x: torch.Tensor, weight: WeightSlice, skip_output: bool = False,
                   grad_into: torch.Tensor | None = None):
    """``x W[rows]^T`` (x (..., in)) or ``x W[:, cols]^T`` (x (..., |cols|)), in x's dtype;
    ``skip_output``: an expanded zero, for a forward run only for its backward, whose output
    nothing reads (no decompression, no product, no memory), the backward unchanged;
    ``grad_into``: the backward adds x's gradient into this float32 (x.numel() // in, in)
    sum in the matmul dtype (unrounded) and hands autograd none."""
    return _SliceMatmul.apply(x, weight, skip_output, grad_into)


def add_slice_product(into: torch.Tensor, a: torch.Tensor, weight: WeightSlice,
                      transposed: bool = False) -> None:
    """``into += a W[slice]^T`` (``a W[slice]`` if ``transposed``) for a float32 ``into``,
    the product kept in the matmul dtype (or, float32, accumulated by the matmul itself)."""
    tile = weight.take()
    try:
        a_m = a.to(tile.dtype)
        w = tile if transposed else tile.T
        if tile.dtype == into.dtype:
            into.addmm_(a_m, w)
        else:
            into.add_(a_m @ w)
    finally:  # the live-byte count stays balanced when the matmul raises
        weight.give_back(tile)


def _product(a: torch.Tensor, weight: WeightSlice, transposed: bool) -> torch.Tensor:
    tile = weight.take()
    try:
        a_m = a.to(tile.dtype)
        return (a_m @ tile if transposed else a_m @ tile.T).to(a.dtype)
    finally:  # the live-byte count stays balanced when the matmul raises
        weight.give_back(tile)


class _SliceMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: WeightSlice, skip_output: bool,
                grad_into: torch.Tensor | None) -> torch.Tensor:
        ctx.weight, ctx.grad_into = weight, grad_into
        layer = weight.layer
        if skip_output:
            n_out = layer.out_features if weight.rows is None else \
                len(range(layer.out_features)[weight.rows])
            return x.new_zeros(()).expand(*x.shape[:-1], n_out)
        return _product(x, weight, transposed=False)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        grad_y = grad_y.contiguous()
        if ctx.grad_into is not None:
            add_slice_product(ctx.grad_into, grad_y.view(-1, grad_y.shape[-1]), ctx.weight,
                              transposed=True)
            return None, None, None, None
        return _product(grad_y, ctx.weight, transposed=True), None, None, None
