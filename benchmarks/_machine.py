"""What a benchmark's report says of the machine it ran on."""

from __future__ import annotations

import os
import platform

from mebp_core.cpu import cpu_flags, cpu_model

FLAGS_SHOWN = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "bf16"})


def machine_report() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(),
            "flags": sorted(cpu_flags() & FLAGS_SHOWN), "python": platform.python_version()}
