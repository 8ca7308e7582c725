"""What this CPU is and can do, read from ``/proc/cpuinfo`` (torch-free: the planner uses it).

``matmul_dtype`` decides where bfloat16 matmuls run: natively on CPUs with bf16 matmul
instructions, in float32 on bf16-stored operands elsewhere, where torch's bf16 kernels run
at 1-20 GFLOP/s against 50-190 for float32 (measured on an AVX2 EPYC; the input-gradient
form is the slowest).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# x86: AVX-512 BF16 and AMX; Arm: FEAT_BF16 (the "bf16" of the Features line)
BF16_MATMUL_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def first_field(cpuinfo: str, *names: str) -> str | None:
    """The value of the first ``name : value`` line of ``cpuinfo`` whose name is one of
    ``names``."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in names:
            return value.strip()
    return None


def cpu_model() -> str:
    return first_field(_cpuinfo(), "model name") or platform.processor() or platform.machine()


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The instruction-set flags of the first CPU (x86 ``flags``, Arm ``Features``) of
    ``cpuinfo``, or of this host (parsed once: the planner asks per configuration)."""
    if cpuinfo is None:
        return _host_flags()
    return frozenset((first_field(cpuinfo, "flags", "Features") or "").split())


@functools.cache
def _host_flags() -> frozenset[str]:
    return cpu_flags(_cpuinfo())


def native_bf16_matmul(cpuinfo: str | None = None) -> bool:
    return bool(cpu_flags(cpuinfo) & BF16_MATMUL_FLAGS)


def matmul_dtype(compute_dtype: str, bf16_matmul: str = "auto") -> str:
    """The dtype the engine's matmuls run in for a ``compute_dtype`` and the ``bf16_matmul``
    knob: "native" keeps bfloat16, "float32" upcasts, "auto" upcasts only where the CPU has
    no bf16 matmul instructions."""
    if compute_dtype != "bfloat16" or bf16_matmul == "native":
        return compute_dtype
    if bf16_matmul == "float32" or not native_bf16_matmul():
        return "float32"
    return "bfloat16"
