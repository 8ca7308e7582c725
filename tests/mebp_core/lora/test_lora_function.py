from __future__ import annotations

import pytest
import torch

from mebp_core.lora import function
from mebp_core.lora.function import lora_delta

SCALING = 2.0


def make_inputs(dtype: torch.dtype, shape=(2, 5, 32), rank=4, out=24, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator).to(dtype).requires_grad_(True)  # (B, T, in)
    lora_a = torch.randn(rank, shape[-1], generator=generator).requires_grad_(True)  # (r, in)
    lora_b = torch.randn(out, rank, generator=generator).requires_grad_(True)  # (out, r)
    grad_y = torch.randn(*shape[:-1], out, generator=generator).to(dtype)
    return x, lora_a, lora_b, grad_y


def reference_delta(x, lora_a, lora_b, scaling):
    return (x @ lora_a.to(x.dtype).T) @ lora_b.to(x.dtype).T * scaling


def run_grads(fn, x, lora_a, lora_b, grad_y):
    y = fn(x, lora_a, lora_b, SCALING)
    grads = torch.autograd.grad(y, (x, lora_a, lora_b), grad_y)
    return y.detach(), grads


def max_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("shape", [(2, 5, 32), (7, 32)])
def test_float32_grads_match_autograd(shape):
    x, lora_a, lora_b, grad_y = make_inputs(torch.float32, shape=shape)
    y, grads = run_grads(lora_delta, x, lora_a, lora_b, grad_y)
    y_ref, grads_ref = run_grads(reference_delta, x, lora_a, lora_b, grad_y)
    assert max_rel_err(y, y_ref) <= 1e-6
    for got, want in zip(grads, grads_ref, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert max_rel_err(got, want) <= 1e-6


def test_bfloat16_input_with_float32_masters():
    # bf16 keeps 8 mantissa bits (rel. step 2^-8 = 0.0039): allow a few roundings, 2e-2.
    x, lora_a, lora_b, grad_y = make_inputs(torch.bfloat16)
    y, (gx, ga, gb) = run_grads(lora_delta, x, lora_a, lora_b, grad_y)
    y_ref, (rx, ra, rb) = run_grads(reference_delta, x, lora_a, lora_b, grad_y)
    assert y.dtype == gx.dtype == torch.bfloat16
    assert ga.dtype == gb.dtype == torch.float32
    for got, want in ((y, y_ref), (gx, rx), (ga, ra), (gb, rb)):
        assert max_rel_err(got, want) <= 2e-2
    x32 = x.detach().float().requires_grad_(True)
    _, (_, ga32, gb32) = run_grads(reference_delta, x32, lora_a, lora_b, grad_y.float())
    assert max_rel_err(ga, ga32) <= 2e-2 and max_rel_err(gb, gb32) <= 2e-2


def test_needs_input_grad_respected():
    x, lora_a, lora_b, grad_y = make_inputs(torch.float32)
    x = x.detach()  # a frozen input: no grad_x requested
    lora_a = lora_a.detach()
    y = lora_delta(x, lora_a, lora_b, SCALING)
    y.backward(grad_y)
    assert x.grad is None and lora_a.grad is None
    _, (_, _, want_b) = run_grads(reference_delta, *make_inputs(torch.float32)[:3], grad_y)
    assert max_rel_err(lora_b.grad, want_b) <= 1e-6


def record_saved_tensors(fn, x, lora_a, lora_b):
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(x, lora_a, lora_b, SCALING)
    return saved


def test_only_x_a_b_are_saved():
    x, lora_a, lora_b, _ = make_inputs(torch.float32, shape=(4, 64, 32), rank=4, out=24)
    saved = record_saved_tensors(lora_delta, x, lora_a, lora_b)
    assert [t.shape for t in saved] == [x.shape, lora_a.shape, lora_b.shape]
    assert saved[0] is x and saved[1] is lora_a and saved[2] is lora_b
    saved_bytes = sum(t.numel() * t.element_size() for t in saved)
    assert saved_bytes == (x.numel() + lora_a.numel() + lora_b.numel()) * 4

    # Plain autograd of the same expression also keeps h = x A^T (N, r): the check can fail.
    plain = record_saved_tensors(reference_delta, x, lora_a, lora_b)
    assert any(t.numel() == 4 * 64 * 4 and t.shape[-1] == 4 for t in plain)
    assert sum(t.numel() * t.element_size() for t in plain) > saved_bytes


def test_bfloat16_saves_masters_not_casts():
    x, lora_a, lora_b, _ = make_inputs(torch.bfloat16)
    saved = record_saved_tensors(lora_delta, x, lora_a, lora_b)
    assert [t.dtype for t in saved] == [torch.bfloat16, torch.float32, torch.float32]


@pytest.mark.parametrize("store_hidden", [False, True])
def test_float32_math_on_bfloat16_rows_is_chunked_and_matches_one_pass(store_hidden):
    """bf16 x with float32 matmuls: x and grad_y are upcast a bounded chunk of rows at a
    time, which changes only the order of float32 sums, never the result beyond that."""
    x, lora_a, lora_b, grad_y = make_inputs(torch.bfloat16, shape=(600, 1024), out=768)
    y, grads = run_grads(lambda *a: lora_delta(*a, store_hidden=store_hidden,
                                               matmul_dtype=torch.float32),
                         x, lora_a, lora_b, grad_y)
    assert 600 * 1024 * 4 > 2 * function.UPCAST_CHUNK_BYTES  # more than one chunk

    def one_pass(x, a, b, scaling):  # the same math on whole float32 copies
        return (reference_delta(x.float(), a, b, scaling)).to(x.dtype)

    want_y, want = run_grads(one_pass, x, lora_a, lora_b, grad_y)
    # a multithreaded GEMM may split its sums differently for fewer rows: the float32
    # results differ in their last bits, so a bf16 output may round one ulp apart
    assert max_rel_err(y, want_y) <= 1e-2
    assert [g.dtype for g in grads] == [torch.bfloat16, torch.float32, torch.float32]
    for got, expected in zip(grads, want, strict=True):
        assert max_rel_err(got, expected) <= (1e-2 if got.dtype == torch.bfloat16 else 1e-5)
