"""The native dequantization kernel gives the torch implementation's results bit for bit."""

from __future__ import annotations

import platform

import pytest
import torch

from mebp_core.cpu import cpu_flags
from mebp_core.store import native
from mebp_core.store.quant import dequantize, quantize

# This CPU's build, and the paths CPUs with fewer instructions take: built here with those
# instructions switched off (x86 compilers' flags). ``expected_vector_bytes`` is the vector
# step each takes on a CPU with the given flags.
X86 = platform.machine() in ("x86_64", "AMD64")
BUILDS = {"this cpu": (), "avx2": ("-mno-avx512f",), "no avx2": ("-mno-avx2",)}


def expected_vector_bytes(build: str, flags: frozenset[str]) -> int:
    vector = 16 if {"avx512f", "avx512bw"} <= flags else 8 if "avx2" in flags else 0
    if build == "avx2":
        return min(vector, 8)
    return 0 if build == "no avx2" else vector


# (output dtype, the dtype whose values it holds): float32 matmuls on a bf16 model take the
# last, bfloat16's values in float32
OUTPUTS = [(torch.float32, None), (torch.bfloat16, None), (torch.float32, torch.bfloat16)]


def dequantize_both(q, bits, group_size, dtype, rows=None, values=None):
    fast = dequantize(q.data, q.scales, q.biases, bits, group_size, dtype, rows=rows,
                      values=values)
    native.set_native_enabled(False)
    try:
        slow = dequantize(q.data, q.scales, q.biases, bits, group_size, dtype, rows=rows,
                          values=values)
    finally:
        native.set_native_enabled(True)
    return fast, slow


def as_bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16 if tensor.dtype == torch.bfloat16 else torch.int32)


def test_the_kernel_builds_here():
    assert native.load_library() is not None


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [16, 32, 64, 128])
@pytest.mark.parametrize(("dtype", "values"), OUTPUTS)
# one thread; rows split over torch's pool at 2 and 3 threads (unevenly) and at one
@pytest.mark.parametrize("n_rows,threads", [(96, 2), (1030, 2), (1030, 3), (1030, 1)])
def test_native_equals_torch_bit_for_bit(bits, group_size, dtype, values, n_rows, threads):
    gen = torch.Generator().manual_seed(bits * group_size)
    q = quantize(torch.randn(n_rows, 256, generator=gen) * 0.05, bits, group_size)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (None, slice(7, 61), torch.tensor([3, 90, 3, 0])):
            fast, slow = dequantize_both(q, bits, group_size, dtype, rows, values)
            assert fast.dtype == dtype
            assert torch.equal(as_bits(fast), as_bits(slow))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bits", [4, 8])
def test_bfloat16s_values_in_float32_are_the_bfloat16_weights_upcast(bits):
    """What a lazy float32 tile of a bf16 model holds: its resident (bf16) weight's values,
    not the unrounded float32 dequantization."""
    gen = torch.Generator().manual_seed(bits)
    q = quantize(torch.randn(64, 256, generator=gen) * 0.05, bits, 64)
    held = dequantize(q.data, q.scales, q.biases, bits, 64, torch.bfloat16)
    unrounded = dequantize(q.data, q.scales, q.biases, bits, 64, torch.float32)
    for tile in dequantize_both(q, bits, 64, torch.float32, values=torch.bfloat16):
        assert torch.equal(as_bits(tile), as_bits(held.float()))
    assert not torch.equal(unrounded, held.float())  # the rounding is not a no-op here


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    from mebp_core.store.kernel_build import compile_library

    libraries = {}
    for name, flags in BUILDS.items():
        target = tmp_path_factory.mktemp("kernels") / "dequant.so"
        compile_library(target, flags)
        libraries[name] = native.open_library(target)
    return libraries


@pytest.mark.skipif(not X86, reason="the builds switch x86 instruction sets off")
@pytest.mark.parametrize("build", BUILDS)
def test_each_build_takes_the_path_its_instructions_allow(builds, build):
    library = builds[build]
    assert library.dequant_vector_bytes() == expected_vector_bytes(build, cpu_flags())


@pytest.mark.skipif(not X86, reason="the builds switch x86 instruction sets off")
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("dtype", "values"), OUTPUTS)
def test_every_cpus_path_equals_torch_bit_for_bit(builds, build, bits, dtype, values):
    """Groups of a whole number of vector steps (96: three on AVX-512; 64, 32), of AVX2's
    steps alone (48, 16) and of neither (6), over weights from 1e-7 (float16 subnormal
    factors) to 1e4."""
    gen = torch.Generator().manual_seed(bits)
    for group_size in (96, 64, 48, 32, 16, 6):
        for magnitude in (1e-7, 0.05, 1e4):
            q = quantize(torch.randn(70, 192, generator=gen) * magnitude, bits, group_size)
            out = torch.empty(70, 192, dtype=dtype)
            assert native.dequantize_native(q.data, q.scales, q.biases, bits, group_size, out,
                                            library=builds[build], values=values)
            native.set_native_enabled(False)
            try:
                slow = dequantize(q.data, q.scales, q.biases, bits, group_size, dtype,
                                  values=values)
            finally:
                native.set_native_enabled(True)
            assert torch.equal(as_bits(out), as_bits(slow)), (group_size, magnitude)


def test_the_kernel_runs_on_torchs_openmp_pool():
    """Its OpenMP entry point is the one in the libgomp torch loaded (fails for a kernel
    built without OpenMP): its threads are torch's pool, not a second one."""
    assert native.runs_on_torchs_pool()


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
