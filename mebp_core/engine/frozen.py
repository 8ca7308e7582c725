"""Frozen projections and embeddings that decompress their weights lazily from the store.

A lazy projection never keeps its weight: in the forward pass it decompresses bounded tiles of
rows and drops each right after its matmul. During a block's backward phase (``share_weights``)
each projection is decompressed once, used by the block's recompute and again by its backward
matmul, and released as soon as that backward has run. Weights made resident (``keep_resident``) are
decompressed once and used in place from then on.

Where the matmuls run in float32 on bfloat16 storage (``mebp_core.cpu.matmul_dtype``), lazy
tiles are decompressed straight to float32 holding bfloat16's values (the model's weights
are its storage dtype's, whichever way a weight is made), while resident and shared weights
stay bfloat16 and are upcast one bounded tile at a time; inputs are upcast per call and
outputs cast back, so everything that outlives a matmul stays bfloat16.
"""

from __future__ import annotations

import mmap
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from mebp_core.resident import block_index


class _Arena:
    """One reused flat buffer for decompressed weights. Filling warm memory runs ~5x faster
    than a fresh allocation (its page faults cost more than the dequantization itself).

    ``take`` bump-allocates; ``reset`` declares every view dead. The buffer grows to the
    largest round seen and stays until ``release``. It is an anonymous mapping of its own,
    not a malloc block: freeing a block that large would raise glibc's mmap threshold and
    leave later activations fragmenting the heap (measured: +30 MB peak). It is private
anonymous memory, counted like every tensor.
    """

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._used = 0  # elements of the buffer taken since the last reset
        self._round_numel = 0  # elements requested since the last reset
        self._capacity = 0  # the largest round seen

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        self._round_numel += numel
        self._capacity = max(self._capacity, self._round_numel)
        buffer = self._buffer
        if self._used == 0 and (buffer is None or buffer.dtype != dtype
                                or buffer.numel() < self._capacity):
            buffer = self._map(self._capacity, dtype)
        if buffer.dtype == dtype and self._used + numel <= buffer.numel():
            self._used += numel
            return buffer[self._used - numel : self._used]
        return torch.empty(numel, dtype=dtype)  # mid-round overflow: earlier views stay valid

    def reset(self) -> None:
        self._used = 0
        self._round_numel = 0

    def mark(self) -> tuple[int, int]:
        return self._used, self._round_numel

    def rewind(self, mark: tuple[int, int]) -> None:
        """Declare the views taken since ``mark`` dead."""
        self._used, self._round_numel = mark

    def release(self) -> None:
        """Free the buffer (it is re-made at its known size on the next take)."""
        self.reset()
        self._buffer = None

    def _map(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        # The mapping is never close()d: torch.frombuffer holds no buffer export, so closing
        # would unmap memory a live view may still read. Every view references the mmap
        # object, which is unmapped when the last view goes.
        self._buffer = None
        # private: a shared anonymous mapping is shmem, charged by the kernel but invisible
        # to RssAnon (the arena would hide from the process's own accounting)
        mapping = mmap.mmap(-1, max(numel * dtype.itemsize, 1),
                            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._buffer = torch.frombuffer(mapping, dtype=dtype, count=numel)
        return self._buffer

    @property
    def nbytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel() * self._buffer.element_size()


@dataclass
class WeightWorkingSet:
    """Counts decompressed frozen weight bytes alive at any time, and the time spent making them."""

    # the dtype the model's weights are held in (the engine's storage dtype): a tile made in
    # a wider matmul dtype holds its values, so that whether a weight is resident, shared or
    # a lazy tile never changes a product
    weight_values: torch.dtype | None = None
    live_bytes: int = 0
    peak_bytes: int = 0
    decompress_s: float = 0.0
    decompressed_params: int = 0
    live_blocks: dict[int, int] = field(default_factory=dict)
    max_live_blocks: int = 0
    shared: dict[str, torch.Tensor] | None = None
    reusing_shared: bool = False
    resident: dict[str, torch.Tensor] = field(default_factory=dict)
    # Tiles (forward, head, unshared backward) and a block's shared weights live in separate
    # arenas, so the block-sized one exists only during the backward pass.
    _tiles: _Arena = field(default_factory=_Arena)
    _shared: _Arena = field(default_factory=_Arena)

    def acquire(self, block: int, nbytes: int) -> None:
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.live_blocks[block] = self.live_blocks.get(block, 0) + nbytes
        self.max_live_blocks = max(self.max_live_blocks, len(self.live_blocks))

    def release(self, block: int, nbytes: int) -> None:
        self.live_bytes -= nbytes
        remaining = self.live_blocks[block] - nbytes
        if remaining:
            self.live_blocks[block] = remaining
        else:
            del self.live_blocks[block]

    def keep_resident(self, store, name: str, dtype: torch.dtype) -> None:
        """Decompress ``name`` once and keep it; it counts as live from now on."""
        if name not in self.resident:
            weight = self.resident[name] = store.dequantize(name, dtype)
            self.live_bytes += weight.numel() * weight.element_size()
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    @property
    def resident_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.resident.values())

    def decompress(self, store, name: str, dtype: torch.dtype, rows: slice | None = None,
                   block: int = -1, keep: bool = False,
                   cols: slice | None = None) -> torch.Tensor:
        """Dequantize ``name`` (or some of its rows, or columns), timing it and counting it
        as live.

        The result lives in a reused arena: with ``keep`` (always, inside a ``share_weights``
        scope, where a recycled tile would overwrite weights still waiting for their backward)
        until that scope (or a ``chunk_scope`` within it) ends, otherwise only until the next
        decompression.
        """
        keep = keep or self.shared is not None
        out_features, in_features = store.info(name).shape
        n_rows = len(range(out_features)[rows]) if rows is not None else out_features
        n_cols = len(range(in_features)[cols]) if cols is not None else in_features
        arena = self._shared if keep else self._tiles
        if not keep:
            arena.reset()
        buffer = arena.take(n_rows * n_cols, dtype).view(n_rows, n_cols)
        part = {} if cols is None else {"cols": cols}
        start = time.perf_counter()
        weight = store.dequantize(name, dtype, rows=rows, out=buffer, values=self.weight_values,
                                  **part)
        self.decompress_s += time.perf_counter() - start
        self.decompressed_params += weight.numel()
        self.acquire(block, weight.numel() * weight.element_size())
        return weight

    def upcast(self, rows: torch.Tensor, dtype: torch.dtype, block: int = -1) -> torch.Tensor:
        """A ``dtype`` copy of some rows of a held (resident or shared) weight, in the tile
        arena: live until the next tile, and dropped like one."""
        self._tiles.reset()
        tile = self._tiles.take(rows.numel(), dtype).view(rows.shape)
        tile.copy_(rows)
        self.acquire(block, tile.numel() * tile.element_size())
        return tile

    def drop(self, weight: torch.Tensor, block: int = -1) -> None:
        self.release(block, weight.numel() * weight.element_size())

    def release_buffers(self, *, tiles: bool = True, shared: bool = True) -> None:
        """Give the reused buffers back between phases that do not need them."""
        if tiles:
            self._tiles.release()
        if shared:
            self._shared.release()

    def reset_counters(self) -> None:
        self.peak_bytes = self.live_bytes
        self.max_live_blocks = len(self.live_blocks)
        self.decompress_s = 0.0
        self.decompressed_params = 0

    @contextmanager
    def reuse_shared(self):
        """Within a ``share_weights`` scope: shared weights first decompressed here outlive
        their backward (a part of the block run a chunk of tokens at a time needs them once
        per chunk) and are released when this scope ends."""
        if self.shared is None:
            yield
            return
        before = set(self.shared)
        self.reusing_shared = True
        try:
            yield
        finally:
            self.reusing_shared = False
            for name in set(self.shared) - before:
                weight = self.shared.pop(name)
                self.release(block_index(name), weight.numel() * weight.element_size())

    @contextmanager
    def chunk_scope(self):
        """Tiles kept within this scope (inside ``share_weights``) are dead when it ends, and
        their arena space is reused by the next: one MLP column chunk's tiles at a time."""
        mark = self._shared.mark()
        try:
            yield
        finally:
            self._shared.rewind(mark)

    @contextmanager
    def share_weights(self):
        """Within this scope each projection is decompressed once and kept until its backward."""
        self.shared = {}
        try:
            yield
        finally:
            leftover, self.shared = self.shared, None
            # Weights whose backward never ran (e.g. an exception) still count as released.
            for name, weight in leftover.items():
                self.release(block_index(name), weight.numel() * weight.element_size())
            self._shared.reset()


class FrozenLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` read from the packed store on demand.

    ``dtype`` is the storage dtype (inputs, outputs, resident and shared weights);
    ``matmul_dtype`` the one the matmuls run in (lazy tiles are decompressed to it)."""

    def __init__(self, store, weight_name: str, bias: torch.Tensor | None, *,
                 working_set: WeightWorkingSet, dtype: torch.dtype, tile_bytes: int,
                 matmul_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.store = store
        self.weight_name = weight_name
        self.out_features, self.in_features = store.info(weight_name).shape
        self.register_buffer("bias", bias, persistent=False)
        self.working_set = working_set
        self.dtype = dtype
        self.matmul_dtype = matmul_dtype or dtype
        self.block = block_index(weight_name)
        row_bytes = self.in_features * self.matmul_dtype.itemsize
        self.tile_rows = max(1, min(self.out_features, tile_bytes // row_bytes))
        # set while a forward runs only for its backward and nothing reads this output
        # (``mebp._residual_output_unused``): the forward makes zeros, neither
        # decompressing nor multiplying, and the backward is what it always is
        self.output_unused = False

    def extra_repr(self) -> str:
        return f"{self.weight_name}, in={self.in_features}, out={self.out_features}"

    def decompress(self, rows: slice | None = None, keep: bool = False) -> torch.Tensor:
        """Rows of the weight: a lazy tile in the matmul dtype, or (``keep``) the block's
        shared copy in the storage dtype."""
        return self.working_set.decompress(
            self.store, self.weight_name, self.dtype if keep else self.matmul_dtype,
            rows=rows, block=self.block, keep=keep)

    def drop(self, weight: torch.Tensor) -> None:
        self.working_set.drop(weight, self.block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _FrozenMatmul.apply(x, self)
        return y if self.bias is None else y + self.bias

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.working_set.resident.get(self.weight_name)
        shared = self.working_set.shared
        if weight is None and shared is not None:
            weight = shared.get(self.weight_name)
            if weight is None:
                weight = shared[self.weight_name] = self.decompress(keep=True)
        if weight is None:
            return self._tiled_forward(x, self.decompress)
        if weight.dtype == self.matmul_dtype:
            return x @ weight.T
        return self._tiled_forward(x, self._upcaster(weight))

    def matmul_transposed(self, grad_y: torch.Tensor) -> torch.Tensor:
        """``grad_y @ W``: the input gradient, consuming the shared weight if there is one
        (decompressed here if its forward made none: its output was unused)."""
        weight = self.working_set.resident.get(self.weight_name)
        shared = self.working_set.shared
        consumed = weight is None and shared is not None
        if consumed:
            weight = shared.pop(self.weight_name, None)
            if weight is None:
                weight = self.decompress(keep=True)
            if self.working_set.reusing_shared:
                shared[self.weight_name] = weight  # for the next chunk's backward
                consumed = False  # released when the reuse scope ends
        if weight is None:
            return self._tiled_backward(grad_y, self.decompress)
        if weight.dtype == self.matmul_dtype:
            grad_x = grad_y @ weight
        else:
            grad_x = self._tiled_backward(grad_y, self._upcaster(weight))
        if consumed:
            self.drop(weight)
        return grad_x

    def _upcaster(self, weight: torch.Tensor):
        return lambda rows: self.working_set.upcast(weight[rows], self.matmul_dtype, self.block)

    def _row_tiles(self):
        for start in range(0, self.out_features, self.tile_rows):
            yield slice(start, min(start + self.tile_rows, self.out_features))

    def _tiled_forward(self, x: torch.Tensor, tile_of) -> torch.Tensor:
        y = x.new_empty(*x.shape[:-1], self.out_features)  # (..., out)
        x_m = x.to(self.matmul_dtype)
        for rows in self._row_tiles():
            tile = tile_of(rows)
            y[..., rows] = x_m @ tile.T
            self.drop(tile)
            del tile
        return y

    def _tiled_backward(self, grad_y: torch.Tensor, tile_of) -> torch.Tensor:
        """The input gradient, each tile's product summed into it in place (no (N, in)
        partial beside the sum)."""
        g = grad_y.reshape(-1, self.out_features)  # (N, out)
        grad_x = None
        for rows in self._row_tiles():
            tile = tile_of(rows)
            g_rows = g[:, rows].to(self.matmul_dtype)
            if grad_x is None:
                grad_x = g_rows @ tile  # (N, in)
            else:
                grad_x.addmm_(g_rows, tile)
            self.drop(tile)
            del tile, g_rows
        return grad_x.view(*grad_y.shape[:-1], self.in_features).to(grad_y.dtype)


class _FrozenMatmul(torch.autograd.Function):
    """Saves nothing for backward: the weight is decompressed again (or shared), never stored."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: FrozenLinear) -> torch.Tensor:
        ctx.layer = layer
        if layer.output_unused:
            return x.new_zeros(*x.shape[:-1], layer.out_features)
        return layer.matmul(x)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None
        return ctx.layer.matmul_transposed(grad_y.contiguous()), None


class FrozenEmbedding(nn.Module):
    """Token embedding lookup that decompresses only the rows it is asked for."""

    def __init__(self, store, weight_name: str, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.store = store
        self.weight_name = weight_name
        self.num_embeddings, self.embedding_dim = store.info(weight_name).shape
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.store.gather_rows(self.weight_name, input_ids.reshape(-1), self.dtype)
        return rows.view(*input_ids.shape, self.embedding_dim)  # (B, T, D)
