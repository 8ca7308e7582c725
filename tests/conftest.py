"""Suite-wide settings (nothing may reach a hub) and the planner's fixed host calibration."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from cpu_load import all_cores_but_one_busy

from mebp_core.plan.calibration import DECOMPRESS_SIZES, HostCalibration, calibration_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def host() -> HostCalibration:
    """A fixed host calibration: the planner's arithmetic is tested on known inputs."""
    return HostCalibration(
        threads=2, runtime_bytes=150 << 20,
        matmul_flops={dtype: {form: {"256": {"64": 3e10 * f, "2048": 8e10 * f},
                                     "4096": {"64": 5e10 * f, "2048": 1.2e11 * f}}
                              for form in ("nt", "nn")}
                      for dtype, f in (("float32", 1.0), ("bfloat16", 2.0))},
        decompress_params_per_s={q: {d: {str(size): 3e9 for size in DECOMPRESS_SIZES}
                                     for d in ("float32", "bfloat16")}
                                 for q in ("int4", "int8", "none")},
        elementwise_bytes_per_s=5e10, op_overhead_s=2e-6, decompress_call_s=5e-5,
        disk_read_bytes_per_s=1e9)


@pytest.fixture(scope="session")
def seed_calibration(host) -> Callable[..., Path]:
    """Writes ``host`` as this machine's cached calibration in a cache dir (no test waits
    for a real measurement), for runs at ``threads`` threads, its throughputs times
    ``speed``; returns the cache dir."""
    def seed(cache_dir: Path, threads: int | None = None, speed: float = 1.0) -> Path:
        scaled = replace(
            host, threads=threads or host.threads,
            matmul_flops={d: {f: {w: {t: r * speed for t, r in by_tokens.items()}
                                  for w, by_tokens in by_width.items()}
                              for f, by_width in forms.items()}
                          for d, forms in host.matmul_flops.items()},
            decompress_params_per_s={q: {d: {size: r * speed for size, r in by_size.items()}
                                         for d, by_size in rates.items()}
                                     for q, rates in host.decompress_params_per_s.items()},
            elementwise_bytes_per_s=host.elementwise_bytes_per_s * speed)
        path = calibration_path(cache_dir, threads)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(scaled)))
        return cache_dir
    return seed


@pytest.fixture(name="all_cores_but_one_busy")
def all_cores_but_one_busy_fixture() -> Iterator[None]:
    """Every core of this host but one kept busy for the test."""
    with all_cores_but_one_busy():
        yield


@pytest.fixture(scope="session")
def check_front() -> Callable[[dict], None]:
    """Checks a plan's JSON: its front is exactly the configurations no other beats on both
    peak memory and step time (figures as rounded in the JSON), and ``auto`` is the fastest
    feasible one; the time is the device's estimate when the plan is ranked by it."""
    def check(plan: dict) -> None:
        time = "device_step_time_s_estimate" if plan["ranked_by"] == "device" \
            else "step_time_s"
        configs = [{**c, "step_time_s": c[time]} for c in plan["configurations"]]

        def beaten(c: dict) -> bool:
            return any(o["peak_mb"] <= c["peak_mb"] and o["step_time_s"] <= c["step_time_s"]
                       and (o["peak_mb"], o["step_time_s"]) != (c["peak_mb"], c["step_time_s"])
                       for o in configs)

        front = {c["id"] for c in configs if c["pareto"]}
        assert front == set(plan["pareto"]) and front
        assert not any(beaten(c) for c in configs if c["pareto"])
        assert all(beaten(c) or any(o["pareto"] and (o["peak_mb"], o["step_time_s"]) ==
                                    (c["peak_mb"], c["step_time_s"]) for o in configs)
                   for c in configs if not c["pareto"])
        feasible = [c for c in configs if c["feasible"]]
        if feasible:
            fastest = min(c["step_time_s"] for c in feasible)
            auto = next(c for c in configs if c["id"] == plan["auto"])
            assert auto["feasible"] and auto["step_time_s"] == fastest
    return check


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory) -> Path:
    """A cache dir that CLI runs share, where a test is not about a first use: the
    dequantization kernel built once and each preset packed on its first run, rather than
    both again in every test's own empty cache."""
    from mebp_core.store.kernel_build import build_kernel

    cache = tmp_path_factory.mktemp("warm-cache")
    build_kernel(cache)
    return cache
