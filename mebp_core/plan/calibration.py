"""This host's throughputs, measured (in a subprocess that imports torch) and cached.

The cache key names the CPU, the core count, the thread count, the torch version, the
dequantization kernel and the measuring code, so a different machine, setting or measurement
is measured afresh. A measurement whose repeats spread too wide is taken again before it is
cached; one that stays that wide is *unsteady*: it is replaced by the next steadier one, and
plans made with it say they are provisional. Every calibration records when, under what load
and with which dequantization kernel it was taken, and plans say so.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from mebp_core.allocator import engine_allocator, engine_environ
from mebp_core.atomic import exclusive_lock, write_json_atomically
from mebp_core.code_version import PACKAGE_DIR, source_digest
from mebp_core.cpu import cpu_model, torch_default_threads
from mebp_core.errors import MebpError
from mebp_core.plan.correction import TimeCorrection, load_corrections
from mebp_core.store.kernel_build import kernel_digest

CALIBRATION_VERSION = 9

# Dequantization is timed at these output sizes (parameters): a small tile and a small model's
# MLP projection, each one call into a reused buffer as tiles are, and a block's worth of such
# projections written one after another into one buffer beyond the caches, as a shared
# block's backward decompresses its weights. Each rate is net of the calls' fixed cost
# (``decompress_call_s``, priced per call); it falls where the output outgrows the caches
# (from a projection to a block: 4.4 -> 1.5 G params/s on a Xeon, 4.6 -> 3.4 on a Zen 4).
DECOMPRESS_PROJECTION_PARAMS = 2816 * 1024
DECOMPRESS_SIZES = (1 << 18, DECOMPRESS_PROJECTION_PARAMS, 8 * DECOMPRESS_PROJECTION_PARAMS)


class CalibrationError(MebpError, RuntimeError):
    """The host measurement failed or its cached copy is unreadable."""


@dataclass(frozen=True)
class HostCalibration:
    threads: int
    runtime_bytes: int  # charged memory (anonymous + shared) after a training run's imports
    # dtype -> form ("nt" forward, "nn" input gradient) -> output width -> tokens -> FLOP/s
    matmul_flops: dict[str, dict[str, dict[str, dict[str, float]]]]
    # quant -> dtype -> output params (DECOMPRESS_SIZES) -> params/s, net of the call's cost
    decompress_params_per_s: dict[str, dict[str, dict[str, float]]]
    elementwise_bytes_per_s: float
    op_overhead_s: float
    decompress_call_s: float  # fixed cost of one dequantization call (tiny tile)
    disk_read_bytes_per_s: float
    # what reading a file directly costs compute beside it, as a share of the reads' time at
    # ``disk_read_bytes_per_s`` (``store_reads`` direct); None where not measured
    read_ahead_cost: float | None = None
    torch: str = ""
    host: str = ""
    # the malloc the measuring process ran under, as every engine here does
    # (``mebp_core.allocator``): the heap's retention depends on it
    allocator: str = "glibc"
    # provenance: the dequantization kernel timed, when, under what 1-minute load average,
    # and each kind of figure's spread (upper quartile of its repeats over the lower)
    kernel: str = ""
    measured_at: str = ""
    load_before: float | None = None
    load_after: float | None = None
    spread: dict[str, float] = field(default_factory=dict)
    retried_at: str | None = None  # when an unsteady calibration was last measured again
    # per matmul dtype, what measured runs on this host say of the modelled step times
    # (never cached with the calibration: read from the runs' record on every load)
    time_corrections: dict[str, TimeCorrection] = field(default_factory=dict)

    @property
    def max_spread(self) -> float | None:
        return max(self.spread.values()) if self.spread else None

    @property
    def steady(self) -> bool:
        """Its repeats agreed within MAX_SPREAD; if not, its time figures are provisional."""
        return (self.max_spread or 1.0) <= MAX_SPREAD

    def provenance(self) -> dict:
        """What a plan says about the calibration it used."""
        return {"host": self.host, "threads": self.threads, "torch": self.torch,
                "kernel": self.kernel, "allocator": self.allocator,
                "measured_at": self.measured_at or None,
                "load_average": [self.load_before, self.load_after],
                "spread": self.spread, "max_spread": self.max_spread,
                "steady": self.steady, "spread_bound": MAX_SPREAD,
                "time_correction": {dtype: c.to_json()
                                    for dtype, c in self.time_corrections.items()}}

    @functools.cached_property
    def _rates(self) -> dict[tuple, float]:
        # a plan prices thousands of matmuls of a few dozen shapes: each rate is interpolated
        # once per calibration (its figures never change after it is made)
        return {}

    @functools.cached_property
    def identity(self) -> str:
        """sha256 of everything a plan made with this calibration depends on: every figure,
        when and how it was measured, the time corrections read with it, and what a plan
        says of it."""
        text = json.dumps([asdict(self), self.provenance()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def matmul_rate(self, dtype: str, tokens: int, out: int = 4096, form: str = "nt") -> float:
        """FLOP/s of a (tokens x in) by (in x out) matmul: interpolated in log tokens and log
        width between the measured points, flat beyond them (below the fewest tokens
        measured, the rate falls in proportion: small matmuls are overhead-bound)."""
        key = ("matmul", dtype, tokens, out, form)
        if key not in self._rates:
            table = self.matmul_flops[dtype][form]
            widths = sorted(int(w) for w in table)
            low, high, frac = _bracket(widths, out)
            self._rates[key] = _interpolate_tokens(table[str(low)], tokens) * (1 - frac) + \
                _interpolate_tokens(table[str(high)], tokens) * frac
        return self._rates[key]

    def matmul_time_s(self, dtype: str, matmuls: tuple[tuple[float, int, int, str], ...]
                      ) -> float:
        """Seconds of ``matmuls`` ((FLOPs, tokens, output width, form) each) in ``dtype``."""
        key = ("matmuls", dtype, matmuls)
        if key not in self._rates:
            self._rates[key] = sum(flops / self.matmul_rate(dtype, rows, width, form)
                                   for flops, rows, width, form in matmuls)
        return self._rates[key]

    def decompress_rate(self, quant: str, dtype: str, params_out: float) -> float:
        """Params/s of dequantizations whose output spans ``params_out`` parameters,
        interpolated in log size between the measured sizes and flat beyond them."""
        key = ("decompress", quant, dtype, params_out)
        if key not in self._rates:
            rates = {int(size): rate
                     for size, rate in self.decompress_params_per_s[quant][dtype].items()}
            low, high, frac = _bracket(sorted(rates), params_out)
            self._rates[key] = rates[low] * (1 - frac) + rates[high] * frac
        return self._rates[key]


def _bracket(points: list[int], value: float) -> tuple[int, int, float]:
    """The measured points around ``value`` and its position between them in log scale."""
    if value <= points[0]:
        return points[0], points[0], 0.0
    for low, high in zip(points, points[1:], strict=False):
        if value <= high:
            return low, high, math.log(value / low) / math.log(high / low)
    return points[-1], points[-1], 0.0


def _interpolate_tokens(rates: dict[str, float], tokens: int) -> float:
    points = sorted(int(t) for t in rates)
    if tokens < points[0]:
        return rates[str(points[0])] * tokens / points[0]
    low, high, frac = _bracket(points, tokens)
    return rates[str(low)] * (1 - frac) + rates[str(high)] * frac


def host_key(threads: int | None) -> str:
    """Names what the figures depend on: CPU, cores, threads (None: the count torch takes by
    default, so a plan that leaves it unset and a run that sets that number share one
    calibration), Python, torch's version, the dequantization kernel, the engine's allocator
    and the code that measures."""
    try:
        torch_version = importlib.metadata.version("torch")  # read without importing torch
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    text = json.dumps([CALIBRATION_VERSION, cpu_model(), os.cpu_count(),
                       threads or torch_default_threads(),
                       platform.python_version(), torch_version, kernel_digest(),
                       engine_allocator(), _measuring_code_digest()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _measuring_code_digest() -> str:
    """Read once per process: an edit under a running service does not move its key."""
    return source_digest(PACKAGE_DIR / "measure_host.py")


def calibration_path(cache_dir: Path, threads: int | None) -> Path:
    return Path(cache_dir) / "calibration" / f"host-{host_key(threads)}.json"


def load_calibration(cache_dir: Path, threads: int | None = None, *,
                     measure: bool = True, remeasure: bool = True) -> HostCalibration | None:
    """The cached calibration for this host, measuring it first if missing and allowed
    (``measure``), and again when unsteady and due (``remeasure`` too: not where a job
    waits on it). One process measures at a time (the API, the workers and the CLI may all
    start at once, and two measurements side by side would each see the other's load); the
    others wait for it. ``threads`` None is torch's default count, measured at that count
    (so the file holds figures for the count its key names)."""
    threads = threads or torch_default_threads()
    path = calibration_path(cache_dir, threads)
    if not path.exists():
        if not measure:
            return None
        with exclusive_lock(path.with_suffix(".lock")):
            if not path.exists():  # measured by the holder we waited for
                write_json_atomically(path, asdict(measure_steady_host(threads)))
    calibration = _read_calibration(path)
    if measure and remeasure and _due_again(calibration):
        with exclusive_lock(path.with_suffix(".lock")):
            calibration = _read_calibration(path)
            if _due_again(calibration):  # not re-measured by the holder we waited for
                again = measure_steady_host(threads)
                if (again.max_spread or 1.0) < (calibration.max_spread or 1.0):
                    write_json_atomically(path, asdict(again))
                    calibration = again
                else:  # no steadier: tried again no sooner than RETRY_UNSTEADY_S from now
                    calibration = dataclasses.replace(calibration, retried_at=_now())
                    write_json_atomically(path, asdict(calibration))
    return dataclasses.replace(
        calibration, time_corrections=load_corrections(path, calibration.measured_at))


def _read_calibration(path: Path) -> HostCalibration:
    try:
        raw = json.loads(path.read_text())
        raw.pop("time_corrections", None)
        return HostCalibration(**raw)
    except (json.JSONDecodeError, TypeError) as exc:
        raise CalibrationError(f"{path}: unreadable calibration ({exc}); delete it to "
                               "measure again") from None


def due_again_in(calibration: HostCalibration) -> float | None:
    """Seconds until an unsteady calibration (every attempt spread wider than MAX_SPREAD: the
    host was busy) is measured again, RETRY_UNSTEADY_S after it was last tried (0: due);
    None for a steady one."""
    if calibration.steady:
        return None
    last = calibration.retried_at or calibration.measured_at
    try:
        age = (datetime.now(UTC) - datetime.fromisoformat(last)).total_seconds()
    except ValueError:
        return 0.0
    return max(0.0, RETRY_UNSTEADY_S - age)


def _due_again(calibration: HostCalibration) -> bool:
    return due_again_in(calibration) == 0.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# A calibration whose figures spread wider than this between repeats was taken on a busy
# host: it is measured again (up to MEASURE_ATTEMPTS times) and the steadiest one is kept.
# Measured on a 2-core Zen 4: idle, the worst kind spread 1.37-1.63 in three runs; with one
# competing process, matmuls spread 5.3.
MAX_SPREAD = 2.0
MEASURE_ATTEMPTS = 3
MEASURE_TIMEOUT_S = 900  # one attempt takes 15 s idle, minutes at load 10
# kept when no attempt was steady enough, but measured again this long after, at a plan or a
# worker's start, and replaced if steadier: one busy minute does not fix a host's figures
RETRY_UNSTEADY_S = 600


def measure_steady_host(threads: int | None = None) -> HostCalibration:
    attempts = []
    for _ in range(MEASURE_ATTEMPTS):
        attempts.append(measure_host(threads))
        if (attempts[-1].max_spread or 1.0) <= MAX_SPREAD:
            break
    return min(attempts, key=lambda c: c.max_spread or 1.0)


def measure_host(threads: int | None = None) -> HostCalibration:
    """Run ``mebp_core.measure_host`` in a subprocess (about 15 s), which dies with this
    process, under the engine's allocator (a fresh tensor's page faults are part of the
    elementwise rate)."""
    command = [sys.executable, "-m", "mebp_core.measure_host", "--parent-pid", str(os.getpid())]
    if threads:
        command += ["--threads", str(threads)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=MEASURE_TIMEOUT_S, env=engine_environ())
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"host measurement hung: no figures after {MEASURE_TIMEOUT_S} "
                               "s") from None
    if done.returncode != 0:
        raise CalibrationError(f"host measurement failed: {done.stderr.strip()[-2000:]}")
    try:
        figures = json.loads(done.stdout)
        return HostCalibration(host=cpu_model(), **figures)
    except (json.JSONDecodeError, TypeError) as exc:
        raise CalibrationError(f"host measurement printed no usable figures ({exc}): "
                               f"{done.stdout[-500:]!r}") from None
