"""The native dequantization kernel: C compiled once per machine with the system compiler.

The C source ships with the package; the shared library is built into the cache directory
(keyed by source, flags and CPU; ``mebp_core.store.kernel_build``) at install, at worker start
or else on first use, loaded with ctypes, and used for contiguous row ranges. Without a
compiler the torch implementation runs instead, with the same results.
"""

from __future__ import annotations

import ctypes
import subprocess
import warnings
from functools import cache

import torch

from mebp_core.store.kernel_build import ensure_library, library_path

_FUNCTIONS = {
    (4, torch.float32): "dequant_int4_f32",
    (4, torch.bfloat16): "dequant_int4_bf16",
    (8, torch.float32): "dequant_int8_f32",
    (8, torch.bfloat16): "dequant_int8_bf16",
}
_enabled = True


def set_native_enabled(enabled: bool) -> None:
    """Switch the native kernel off (or back on), e.g. to compare both paths in tests."""
    global _enabled
    _enabled = enabled


@cache
def load_library() -> ctypes.CDLL | None:
    try:
        library = ctypes.CDLL(str(ensure_library()))
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"native dequantization unavailable ({exc}); using torch", stacklevel=2)
        return None
    for name in _FUNCTIONS.values():
        getattr(library, name).restype = None
    return library


def kernel_name() -> str:
    """Which dequantization runs on this host: the native library (named by the digest of its
    source, flags and CPU) once built and loaded, else ``torch``."""
    from mebp_core.cache import default_cache_dir

    if _enabled and load_library() is not None:
        return library_path(default_cache_dir()).stem
    return "torch"


def dequantize_native(data: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                      bits: int, group_size: int, out: torch.Tensor) -> bool:
    """Fill ``out`` (N, K) from contiguous packed rows; False when the kernel cannot."""
    function = _FUNCTIONS.get((bits, out.dtype))
    if not _enabled or function is None or not (data.is_contiguous() and out.is_contiguous()):
        return False
    library = load_library()
    if library is None:
        return False
    scales32 = scales.to(torch.float32).contiguous()  # (N, G): 1/32 of the output's bytes
    biases32 = biases.to(torch.float32).contiguous()
    rows, k = out.shape
    getattr(library, function)(
        ctypes.c_void_p(data.data_ptr()), ctypes.c_void_p(scales32.data_ptr()),
        ctypes.c_void_p(biases32.data_ptr()), ctypes.c_int64(rows), ctypes.c_int64(k),
        ctypes.c_int64(group_size), ctypes.c_void_p(out.data_ptr()),
        ctypes.c_int(torch.get_num_threads()))
    return True
