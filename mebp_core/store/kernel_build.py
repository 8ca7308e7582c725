"""Building the native dequantization kernel, without importing torch: the C source that
ships with the package, compiled once per machine with the system compiler into the cache
directory, named by a digest of its source, flags and CPU. The planner keys its host
calibration on that name; the worker builds it at start, so no job compiles it inside its
memory cap."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from mebp_core.cpu import cpu_flags

SOURCE = Path(__file__).with_name("native") / "dequant.c"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")


@functools.cache
def kernel_digest() -> str:
    """The built library's name: what it was compiled from, how, and for which CPU."""
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(),
                 " ".join(sorted(cpu_flags())).encode(), platform.machine().encode()):
        digest.update(part)
    return f"dequant-{digest.hexdigest()[:16]}"


def library_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / "kernels" / f"{kernel_digest()}.so"


def compile_library(target: Path, extra_flags: tuple[str, ...] = (),
                    source: Path = SOURCE) -> None:
    """Compile the kernel to ``target``; ``extra_flags`` (e.g. ``-mno-avx512f``) build the
    paths a CPU with fewer instructions takes, ``source`` another version of it."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc or gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, *extra_flags, str(source), "-o", tmp], check=True,
                       capture_output=True, timeout=120)
        os.replace(tmp, target)  # atomic: concurrent builders never load a partial library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ensure_library(cache_dir: Path | None = None) -> Path:
    """The library, compiled first if missing (``OSError`` or ``SubprocessError`` when this
    machine cannot build it)."""
    from mebp_core.cache import default_cache_dir

    target = library_path(cache_dir or default_cache_dir())
    if not target.exists():
        compile_library(target)
    return target


def build_kernel(cache_dir: Path | None = None) -> Path | None:
    """``ensure_library``, or None when this machine cannot build it (the engine then runs
    torch's dequantization)."""
    try:
        return ensure_library(cache_dir)
    except (OSError, subprocess.SubprocessError):
        return None
