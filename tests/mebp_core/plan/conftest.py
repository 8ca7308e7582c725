"""A fixed host calibration: the planner's arithmetic is tested on known inputs."""

from __future__ import annotations

import pytest

from mebp_core.plan.calibration import HostCalibration


@pytest.fixture
def host() -> HostCalibration:
    return HostCalibration(
        threads=2, runtime_anon_bytes=150 << 20,
        matmul_flops={dtype: {form: {"256": {"64": 3e10 * f, "2048": 8e10 * f},
                                        "4096": {"64": 5e10 * f, "2048": 1.2e11 * f}}
                              for form in ("nt", "nn")}
                      for dtype, f in (("float32", 1.0), ("bfloat16", 2.0))},
        decompress_params_per_s={q: {"float32": 3e9, "bfloat16": 3e9}
                                 for q in ("int4", "int8", "none")},
        elementwise_bytes_per_s=5e10, op_overhead_s=2e-6, decompress_call_s=5e-5,
        disk_read_bytes_per_s=1e9)
