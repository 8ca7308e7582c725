"""The native dequantization kernel gives the torch implementation's results bit for bit."""

from __future__ import annotations

import pytest
import torch

from mebp_core.store import native
from mebp_core.store.quant import dequantize, quantize


def dequantize_both(q, bits, group_size, dtype, rows=None):
    fast = dequantize(q.data, q.scales, q.biases, bits, group_size, dtype, rows=rows)
    native.set_native_enabled(False)
    try:
        slow = dequantize(q.data, q.scales, q.biases, bits, group_size, dtype, rows=rows)
    finally:
        native.set_native_enabled(True)
    return fast, slow


def test_the_kernel_builds_here():
    assert native.load_library() is not None


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_rows", [96, 1030])  # one thread; rows split over the pool
def test_native_equals_torch_bit_for_bit(bits, group_size, dtype, n_rows):
    gen = torch.Generator().manual_seed(bits * group_size)
    q = quantize(torch.randn(n_rows, 256, generator=gen) * 0.05, bits, group_size)
    for rows in (None, slice(7, 61), torch.tensor([3, 90, 3, 0])):
        fast, slow = dequantize_both(q, bits, group_size, dtype, rows)
        assert fast.dtype == dtype
        assert torch.equal(fast.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                           slow.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))


def test_the_kernel_runs_on_torchs_openmp_pool():
    """Linked against libgomp.so.1, which resolves to the copy torch loaded: one OpenMP
    runtime in the process, so the kernel's threads are torch's (no second pool)."""
    import subprocess

    library = native.load_library()
    assert library is not None
    needed = subprocess.run(["ldd", library._name], capture_output=True, text=True).stdout
    assert "libgomp.so.1" in needed
    with open("/proc/self/maps") as maps:
        runtimes = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(runtimes) == 1 and "torch" in next(iter(runtimes)), runtimes


def test_native_path_is_taken_and_fills_out():
    q = quantize(torch.randn(8, 64), 4, 64)
    out = torch.full((8, 64), float("nan"))
    assert native.dequantize_native(q.data, q.scales, q.biases, 4, 64, out)
    assert torch.isfinite(out).all()


def test_unsupported_dtype_falls_back():
    """The kernel declines a dtype it has no function for; torch's path serves it."""
    q = quantize(torch.randn(8, 64), 8, 64)
    out = torch.empty(8, 64, dtype=torch.float16)
    assert not native.dequantize_native(q.data, q.scales, q.biases, 8, 64, out)
    result = dequantize(q.data, q.scales, q.biases, 8, 64, torch.float16)
    assert result.dtype == torch.float16
    reference = dequantize(q.data, q.scales, q.biases, 8, 64, torch.float32)
    torch.testing.assert_close(result.float(), reference, rtol=1e-3, atol=1e-3)


def test_the_kernel_is_built_ahead_and_named_without_torch(tmp_path):
    """The worker and `make setup` build it (never a job inside its cap); the planner keys
    its calibration on its name, which a torch-free process can compute."""
    import subprocess
    import sys

    from mebp_core.store.kernel_build import build_kernel, kernel_digest

    built = build_kernel(tmp_path)
    assert built is not None and built.name == f"{kernel_digest()}.so" and built.is_file()
    assert build_kernel(tmp_path) == built  # built once
    code = ("import sys; from mebp_core.plan.calibration import host_key; host_key(None); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "False", done.stderr
