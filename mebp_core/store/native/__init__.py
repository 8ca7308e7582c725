"""The native dequantization kernel: C compiled once per machine with the system compiler.

The C source ships with the package; the shared library is built on first use into the
cache directory (keyed by source, flags and CPU), loaded with ctypes, and used for contiguous
row ranges. Without a compiler the torch implementation runs instead, with the same results.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from functools import cache
from pathlib import Path

import torch

from mebp_core.cpu import cpu_flags

SOURCE = Path(__file__).with_name("dequant.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC")
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


def _library_path(cache_dir: Path) -> Path:
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(),
                 " ".join(sorted(cpu_flags())).encode(), platform.machine().encode()):
        digest.update(part)
    return cache_dir / "kernels" / f"dequant-{digest.hexdigest()[:16]}.so"


def _compile(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc or gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], check=True,
                       capture_output=True, timeout=120)
        os.replace(tmp, target)  # atomic: concurrent builders never load a partial library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@cache
def load_library() -> ctypes.CDLL | None:
    from mebp_core.cache import default_cache_dir

    target = _library_path(default_cache_dir())
    try:
        if not target.exists():
            _compile(target)
        library = ctypes.CDLL(str(target))
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
        return _library_path(default_cache_dir()).stem
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
        ctypes.c_int64(group_size), ctypes.c_void_p(out.data_ptr()))
    return True
