"""This host's throughputs, measured once (in a subprocess that imports torch) and cached.

The cache key names the CPU, the core count, the thread count and the torch version, so a
different machine, or a different setting, is measured afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from mebp_core.errors import MebpError

CALIBRATION_VERSION = 2


class CalibrationError(MebpError, RuntimeError):
    """The host measurement failed or its cached copy is unreadable."""


@dataclass(frozen=True)
class HostCalibration:
    threads: int
    runtime_anon_bytes: int  # anonymous memory after the imports of a training run
    matmul_flops: dict[str, dict[str, float]]  # dtype -> tokens per matmul -> FLOP/s
    decompress_params_per_s: dict[str, dict[str, float]]  # quant -> dtype -> params/s
    elementwise_bytes_per_s: float
    op_overhead_s: float
    decompress_call_s: float  # fixed cost of one dequantization call (tiny tile)
    disk_read_bytes_per_s: float
    torch: str = ""
    host: str = ""

    def matmul_rate(self, dtype: str, tokens: int) -> float:
        """FLOP/s of an (tokens x d) @ (d x f) matmul, interpolated between measured sizes."""
        points = sorted((int(k), v) for k, v in self.matmul_flops[dtype].items())
        if tokens <= points[0][0]:
            return points[0][1] * tokens / points[0][0]  # small matmuls are overhead-bound
        for (t0, r0), (t1, r1) in zip(points, points[1:], strict=False):
            if tokens <= t1:
                return r0 + (r1 - r0) * (tokens - t0) / (t1 - t0)
        return points[-1][1]

    def decompress_rate(self, quant: str, dtype: str) -> float:
        return self.decompress_params_per_s[quant][dtype]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_key(threads: int | None) -> str:
    """Names what the figures depend on: CPU, cores, threads, Python, torch's pinned version."""
    text = json.dumps([CALIBRATION_VERSION, cpu_model(), os.cpu_count(), threads,
                       platform.python_version()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def calibration_path(cache_dir: Path, threads: int | None) -> Path:
    return Path(cache_dir) / "calibration" / f"host-{host_key(threads)}.json"


def load_calibration(cache_dir: Path, threads: int | None = None, *,
                     measure: bool = True) -> HostCalibration | None:
    """The cached calibration for this host, measuring it first if missing and allowed."""
    path = calibration_path(cache_dir, threads)
    if path.exists():
        try:
            return HostCalibration(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError) as exc:
            raise CalibrationError(f"{path}: unreadable calibration ({exc}); delete it to "
                                   "measure again") from None
    if not measure:
        return None
    calibration = measure_host(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(calibration), indent=1))
    tmp.replace(path)
    return calibration


def measure_host(threads: int | None = None) -> HostCalibration:
    """Run ``mebp_core.plan.measure_host`` in a subprocess (about 15 s)."""
    command = [sys.executable, "-m", "mebp_core.plan.measure_host"]
    if threads:
        command += ["--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CalibrationError(f"host measurement failed: {done.stderr.strip()[-2000:]}")
    figures = json.loads(done.stdout)
    return HostCalibration(host=cpu_model(), **figures)
