"""Group-wise affine quantization along the input (last) dimension, MLX-style.

Per group of ``group_size`` values ``w ~= scale * q + bias`` with ``q`` unsigned
(int4: 0..15, int8: 0..255) and ``scale``/``bias`` float16. int4 packs two values per byte
along the input dim: low nibble = even column, high nibble = odd column.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mebp_core.store.errors import QuantizationError
from mebp_core.store.groups import is_quantizable
from mebp_core.store.native import dequantize_native

SUPPORTED_BITS = (4, 8)
CHUNK_ELEMENTS = 1 << 20  # rows per dequantization chunk = CHUNK_ELEMENTS // K


@dataclass(frozen=True)
class QuantizedTensor:
    data: torch.Tensor  # (N, K/2) uint8 for int4, (N, K) uint8 for int8
    scales: torch.Tensor  # (N, K/group_size) float16
    biases: torch.Tensor  # (N, K/group_size) float16


def check_quantizable(shape: tuple[int, ...], bits: int, group_size: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise QuantizationError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    if not is_quantizable(shape, group_size):
        raise QuantizationError(
            f"shape {tuple(shape)} cannot be quantized with group_size {group_size}: "
            "need a 2-D weight whose input dim is a multiple of an even group_size"
        )


def _round_half(x: torch.Tensor, toward: float) -> torch.Tensor:
    """float32 -> float16 rounded toward +inf or -inf, so the float16 range still covers x."""
    h = x.to(torch.float16)
    off = h.float() < x if toward > 0 else h.float() > x
    bumped = torch.nextafter(h, torch.full_like(h, toward))
    return torch.where(off, bumped, h)


def quantize(w: torch.Tensor, bits: int = 4, group_size: int = 64) -> QuantizedTensor:
    """Quantize a (N, K) weight; every element round-trips within scale/2 (in float32)."""
    check_quantizable(tuple(w.shape), bits, group_size)
    n_rows, k = w.shape
    qmax = (1 << bits) - 1
    wg = w.detach().to(torch.float32).reshape(n_rows, k // group_size, group_size)  # (N, G, g)
    if not bool(torch.isfinite(wg).all()):
        raise QuantizationError("cannot quantize a tensor with inf or nan values")
    # Bias rounds down and scale up so that [bias, bias + qmax*scale] still spans the group
    # after float16 rounding: the clamp below then never adds error beyond scale/2.
    biases = _round_half(wg.amin(dim=-1), toward=float("-inf"))  # (N, G)
    span = wg.amax(dim=-1) - biases.float()
    scales = _round_half(span / qmax, toward=float("inf"))
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # constant groups
    q = (wg - biases.float()[..., None]) / scales.float()[..., None]
    q = q.round_().clamp_(0, qmax).to(torch.uint8).reshape(n_rows, k)
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    return QuantizedTensor(q.contiguous(), scales, biases)


def unpack_int4(data: torch.Tensor) -> torch.Tensor:
    """(N, K/2) packed bytes -> (N, K) uint8 nibbles, low nibble first."""
    # One int16 per byte: d + 15*(d & 0xF0) == lo | hi << 8, whose little-endian bytes are
    # (lo, hi). About 3x faster than stacking the two nibble planes.
    d = data.to(torch.int16)
    return d.add_(d & 0xF0, alpha=15).view(torch.uint8)


def _dequantize_into(
    out: torch.Tensor,
    data: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
) -> None:
    n_rows, k = out.shape
    out.copy_(unpack_int4(data) if bits == 4 else data)
    # In-place mul_/add_ beat a fused addcmul here: broadcasting the per-group factors makes
    # addcmul fall off its vectorized path (measured 2x slower).
    view = out.view(n_rows, k // group_size, group_size)  # (N, G, g)
    view.mul_(scales.to(out.dtype)[..., None]).add_(biases.to(out.dtype)[..., None])


def _select_rows(t: torch.Tensor, rows: slice | torch.Tensor | None) -> torch.Tensor:
    if rows is None:
        return t
    if isinstance(rows, slice):
        return t[rows]
    return t.index_select(0, rows)


def dequantize(
    data: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    rows: slice | torch.Tensor | None = None,
    cols: slice | None = None,
    values: torch.dtype | None = None,
) -> torch.Tensor:
    """Dequantize the selected rows (all, a slice, or a LongTensor of indices) and columns
    (all, or a step-1 slice) into ``dtype`` (``out``'s when given).

    ``values``: the dtype whose values the output holds, when narrower than ``dtype``
    (bfloat16's values in float32, for float32 matmuls on a model held in bfloat16).
    Works on row-sliced views of the packed arrays too; writes into ``out`` when given.
    """
    data = _select_rows(data, rows)
    scales = _select_rows(scales, rows)
    biases = _select_rows(biases, rows)
    if cols is not None:
        return _dequantize_columns(data, scales, biases, bits, group_size, dtype, out, cols,
                                   values)
    n_rows = data.shape[0]
    k = data.shape[1] * 2 if bits == 4 else data.shape[1]
    if out is None:
        out = torch.empty(n_rows, k, dtype=dtype)
    elif out.shape != (n_rows, k) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous ({n_rows}, {k}) tensor, got {out.shape}")
    # Row chunks keep the integer temporaries and the float32 scratch cache-sized: on a
    # (2560, 10240) matrix, one-shot dequantization ran 5x slower than chunked (page faults
    # on fresh 50-100 MB temporaries). Lower-precision outputs are computed in float32 and
    # cast once: as fast as computing in bfloat16 (measured) and exact to half an output ulp.
    values = values or out.dtype
    if n_rows and dequantize_native(data, scales, biases, bits, group_size, out,
                                    values=values):
        return out
    step = max(1, CHUNK_ELEMENTS // k)
    direct = out.dtype == torch.float32
    scratch = None if direct else torch.empty(min(step, n_rows), k, dtype=torch.float32)
    for start in range(0, n_rows, step):
        chunk = slice(start, min(n_rows, start + step))
        dst = out[chunk] if direct else scratch[: chunk.stop - start]
        _dequantize_into(dst, data[chunk], scales[chunk], biases[chunk], bits, group_size)
        if direct and values != torch.float32:  # a float32 output holding narrower values
            dst.copy_(dst.to(values))
        if not direct:
            out[chunk].copy_(dst)
    return out


def _dequantize_columns(data, scales, biases, bits: int, group_size: int, dtype: torch.dtype,
                        out: torch.Tensor | None, cols: slice,
                        values: torch.dtype | None) -> torch.Tensor:
    """Columns [start, stop): the groups covering them, copied contiguous from the packed
    views (what the native kernel reads), dequantized, and narrowed when unaligned."""
    k = data.shape[1] * 8 // bits
    start, stop, step = cols.indices(k)
    if step != 1:
        raise ValueError(f"columns must be a step-1 slice, got {cols}")
    first, last = start // group_size, -(-stop // group_size)  # covering groups [first, last)
    width = stop - start
    byte = slice(first * group_size * bits // 8, last * group_size * bits // 8)
    covering = slice(first, last)
    aligned = start == first * group_size and stop == last * group_size
    target = out if aligned else None
    if out is not None and out.shape != (data.shape[0], width):
        raise ValueError(f"out must be a ({data.shape[0]}, {width}) tensor, got {out.shape}")
    whole = dequantize(data[:, byte].contiguous(), scales[:, covering].contiguous(),
                       biases[:, covering].contiguous(), bits, group_size, dtype, out=target,
                       values=values)
    if aligned:
        return whole
    part = whole[:, start - first * group_size : stop - first * group_size]
    return part.contiguous() if out is None else out.copy_(part)
