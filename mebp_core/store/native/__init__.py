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
from pathlib import Path

import torch

from mebp_core.store.kernel_build import ensure_library, library_path

# (bits, the output's dtype, the dtype whose values it holds)
_FUNCTIONS = {
    (4, torch.float32, torch.float32): "dequant_int4_f32",
    (4, torch.bfloat16, torch.bfloat16): "dequant_int4_bf16",
    (4, torch.float32, torch.bfloat16): "dequant_int4_bf16_f32",
    (8, torch.float32, torch.float32): "dequant_int8_f32",
    (8, torch.bfloat16, torch.bfloat16): "dequant_int8_bf16",
    (8, torch.float32, torch.bfloat16): "dequant_int8_bf16_f32",
}
_enabled = True


def set_native_enabled(enabled: bool) -> None:
    """Switch the native kernel off (or back on), e.g. to compare both paths in tests."""
    global _enabled
    _enabled = enabled


@cache
def load_library() -> ctypes.CDLL | None:
    try:
        return open_library(ensure_library())
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"native dequantization unavailable ({exc}); using torch", stacklevel=2)
        return None


def open_library(path: Path) -> ctypes.CDLL:
    """A build of the kernel; an older revision's (a benchmark's) may lack later functions,
    which it then declines."""
    library = ctypes.CDLL(str(path))
    for name in _FUNCTIONS.values():
        if hasattr(library, name):
            getattr(library, name).restype = None
    return library


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


@cache
def runs_on_torchs_pool() -> bool:
    """Whether the kernel's OpenMP entry point is the one in the libgomp torch loaded: only
    then are its threads torch's own pool. Built without OpenMP, or bound to another runtime
    (a second pool spinning beside torch's), it is run on one thread."""
    library = load_library()
    if library is None:
        return False
    libc = ctypes.CDLL(None)
    libc.dlsym.restype = ctypes.c_void_p
    libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    address = libc.dlsym(library._handle, b"GOMP_parallel")  # the library's own lookup scope
    info = _DlInfo()
    if not address or not libc.dladdr(address, ctypes.byref(info)):
        return False
    torch_lib = Path(torch.__file__).parent / "lib"
    return Path(info.dli_fname.decode()).resolve().parent == torch_lib.resolve()


def kernel_name() -> str:
    """Which dequantization runs on this host: the native library (named by the digest of its
    source, flags and CPU) once built and loaded, else ``torch``."""
    from mebp_core.cache import default_cache_dir

    if _enabled and load_library() is not None:
        return library_path(default_cache_dir()).stem
    return "torch"


def dequantize_native(data: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                      bits: int, group_size: int, out: torch.Tensor,
                      library: ctypes.CDLL | None = None,
                      values: torch.dtype | None = None) -> bool:
    """Fill ``out`` (N, K) from contiguous packed rows, with the values of ``values`` (by
    default ``out``'s dtype); False when the kernel cannot. ``library``: another build of it
    (``open_library``) than this host's."""
    function = _FUNCTIONS.get((bits, out.dtype, values or out.dtype))
    if not _enabled or function is None or not (data.is_contiguous() and out.is_contiguous()):
        return False
    library = library or load_library()
    kernel = None if library is None else getattr(library, function, None)
    if kernel is None:
        return False
    scales32 = scales.to(torch.float32).contiguous()  # (N, G): 1/32 of the output's bytes
    biases32 = biases.to(torch.float32).contiguous()
    rows, k = out.shape
    kernel(
        ctypes.c_void_p(data.data_ptr()), ctypes.c_void_p(scales32.data_ptr()),
        ctypes.c_void_p(biases32.data_ptr()), ctypes.c_int64(rows), ctypes.c_int64(k),
        ctypes.c_int64(group_size), ctypes.c_void_p(out.data_ptr()),
        ctypes.c_int(torch.get_num_threads() if runs_on_torchs_pool() else 1))
    return True
