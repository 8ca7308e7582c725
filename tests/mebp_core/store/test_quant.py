from __future__ import annotations

import pytest
import torch

from mebp_core.store.errors import QuantizationError
from mebp_core.store.quant import dequantize, quantize, unpack_int4


def assert_within_bound(w: torch.Tensor, qt, bits: int, group_size: int) -> None:
    """|dequantized - w| <= scale/2 per element, up to float32 arithmetic."""
    n, k = w.shape
    approx = dequantize(qt.data, qt.scales, qt.biases, bits, group_size, torch.float32)
    err = (approx - w).abs().view(n, k // group_size, group_size)  # (N, G, g)
    scale = qt.scales.float()[..., None]
    slack = 4 * torch.finfo(torch.float32).eps * w.abs().max()
    assert bool((err <= scale / 2 + slack).all()), float((err - scale / 2).max())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_round_trip_error_is_at_most_half_a_step(bits, group_size):
    torch.manual_seed(bits * 1000 + group_size)
    w = torch.randn(48, 256) * 0.02
    w[3, :group_size] += 5.0  # one group with a large offset and small relative range
    qt = quantize(w, bits, group_size)
    assert qt.data.dtype == torch.uint8
    assert qt.data.shape == (48, 256 * bits // 8)
    assert qt.scales.shape == qt.biases.shape == (48, 256 // group_size)
    assert qt.scales.dtype == qt.biases.dtype == torch.float16
    assert_within_bound(w, qt, bits, group_size)
    # a step of 4-bit spans range/15: the bound is not vacuous
    if bits == 4:
        assert float(qt.scales.float().max()) < 0.02 * 10 / 15


def test_hand_made_group_has_exact_codes_and_values():
    w = (torch.arange(16, dtype=torch.float32) * 0.5 - 1.0)[None, :]  # -1.0 .. 6.5
    qt = quantize(w, bits=4, group_size=16)
    assert qt.scales.tolist() == [[0.5]]
    assert qt.biases.tolist() == [[-1.0]]
    # low nibble = even column, high nibble = odd column
    assert qt.data[0].tolist() == [q0 | (q0 + 1) << 4 for q0 in range(0, 16, 2)]
    assert unpack_int4(qt.data)[0].tolist() == list(range(16))
    assert torch.equal(dequantize(qt.data, qt.scales, qt.biases, 4, 16, torch.float32), w)


def test_constant_group_is_exact():
    w = torch.full((2, 64), 0.3)
    w[1] = 0.0
    for bits in (4, 8):
        qt = quantize(w, bits, 64)
        assert bool(torch.isfinite(qt.scales).all())
        approx = dequantize(qt.data, qt.scales, qt.biases, bits, 64, torch.float32)
        assert torch.allclose(approx, w.half().float(), atol=1e-4)


@pytest.mark.parametrize("bits", [4, 8])
def test_row_slices_indices_views_and_out_match_full(bits):
    torch.manual_seed(1)
    w = torch.randn(40, 128)
    qt = quantize(w, bits, 64)
    full = dequantize(qt.data, qt.scales, qt.biases, bits, 64, torch.float32)
    tile = dequantize(qt.data, qt.scales, qt.biases, bits, 64, torch.float32, rows=slice(5, 17))
    assert torch.equal(tile, full[5:17])
    view = dequantize(qt.data[20:30], qt.scales[20:30], qt.biases[20:30], bits, 64)
    assert torch.equal(view, full[20:30])
    idx = torch.tensor([39, 0, 7, 7])
    assert torch.equal(dequantize(qt.data, qt.scales, qt.biases, bits, 64, rows=idx), full[idx])
    out = torch.empty(12, 128)
    res = dequantize(qt.data, qt.scales, qt.biases, bits, 64, out=out, rows=slice(5, 17))
    assert res.data_ptr() == out.data_ptr() and torch.equal(out, full[5:17])
    bf16 = dequantize(qt.data, qt.scales, qt.biases, bits, 64, torch.bfloat16)
    assert torch.equal(bf16, full.to(torch.bfloat16))  # computed in float32, rounded once


def test_refuses_shapes_it_cannot_group():
    with pytest.raises(QuantizationError, match="group_size"):
        quantize(torch.zeros(4, 100), 4, 64)
    with pytest.raises(QuantizationError, match="group_size"):
        quantize(torch.zeros(64), 4, 64)
    with pytest.raises(QuantizationError, match="bits"):
        quantize(torch.zeros(4, 64), 3, 64)
    with pytest.raises(QuantizationError, match="nan"):
        quantize(torch.full((1, 64), float("nan")), 4, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matrices_spanning_several_internal_chunks(dtype):
    torch.manual_seed(2)
    w = torch.randn(300, 4096) * 0.02  # 256 rows per internal chunk: one full, one partial
    qt = quantize(w, 4, 64)
    full = dequantize(qt.data, qt.scales, qt.biases, 4, 64, dtype)
    per_row = torch.cat(
        [
            dequantize(qt.data, qt.scales, qt.biases, 4, 64, dtype, rows=slice(i, i + 1))
            for i in range(0, 300, 7)
        ]
    )
    assert torch.equal(full[::7], per_row)
    assert_within_bound(w, qt, 4, 64)
