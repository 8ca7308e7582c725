"""What measured steps say about this host's step-time predictions.

After each training run the runner records its measured step time (the median of its steps
after the first, which also pays for first touches of the store) beside what the model
predicted for that configuration, part by part (matmul, decompression, elementwise traffic,
per-op overhead). Plans on this host then correct their step times per matmul dtype:

- the prior is one factor, the median measured/modelled ratio of the last few runs, so one
  run already moves every plan toward what was measured;
- each part then gets its own factor, fitted by ridge regression on the recent runs'
  relative errors and pulled toward the prior: configurations differ in their mix of parts
  (a lazy one decompresses, a resident one does not), and a host may be slower than its
  calibration at one part only. With one run, or runs of one mix, the fit is the prior.

Runs are kept per calibration: a fresh calibration starts without a correction.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from mebp_core.atomic import exclusive_lock, write_json_atomically

RECENT_RUNS = 5  # the prior is the median of this many latest runs' ratios
FIT_RUNS = 12  # the per-part factors are fitted on this many latest runs
# how strongly the part factors are held to the prior, against runs' squared relative errors
# (a part that is a run's whole time weighs 1 per run): a few runs of one mix move little
RIDGE = 0.3
PART_FACTOR_BOUNDS = (0.25, 4.0)  # times the prior: a fit outside says the data is too thin
KEPT_RUNS = 50  # the history kept in the file, for inspection
# a run whose steps ran this far from the model's time says more about the run than the host
RATIO_BOUNDS = (0.01, 100.0)


@dataclass(frozen=True)
class TimeCorrection:
    """How plans correct their modelled step time, and what it rests on."""

    factor: float  # the prior: the median ratio of the latest runs
    runs: int  # how many measured runs the prior is the median of
    matmul_dtype: str
    part_factors: dict[str, float] = field(default_factory=dict)  # absent: the prior
    fitted_runs: int = 0  # how many runs the part factors are fitted on

    def apply(self, time_by_part: dict[str, float]) -> dict[str, float]:
        return {part: seconds * self.part_factors.get(part, self.factor)
                for part, seconds in time_by_part.items()}

    def to_json(self) -> dict:
        return {"factor": round(self.factor, 4), "runs": self.runs,
                "matmul_dtype": self.matmul_dtype, "fitted_runs": self.fitted_runs,
                "part_factors": {p: round(f, 4) for p, f in self.part_factors.items()}}


def correction_path(calibration_file: Path) -> Path:
    return calibration_file.with_name(calibration_file.stem + "-time-correction.json")


def steady_step_time(step_times: list[float]) -> float | None:
    """A run's step time: the median of its steps after the first (warm-up) one; the first
    when it is the only one, None without steps."""
    timed = step_times[1:] or step_times
    return statistics.median(timed) if timed else None


def measured_step_time(step_times: list[float]) -> float | None:
    """``steady_step_time``, or None with fewer than two steps: the first alone is not
    representative enough to correct the planner with."""
    return steady_step_time(step_times) if len(step_times) > 1 else None


def load_corrections(calibration_file: Path, calibrated_at: str) -> dict[str, TimeCorrection]:
    """Per matmul dtype, the correction from the runs measured against this calibration."""
    runs = [r for r in _read(correction_path(calibration_file))
            if r.get("calibrated_at") == calibrated_at]
    corrections = {}
    for dtype in sorted({r["matmul_dtype"] for r in runs}):
        of_dtype = [r for r in runs if r["matmul_dtype"] == dtype]
        corrections[dtype] = correction_from(of_dtype, dtype)
    return corrections


def correction_from(runs: list[dict], matmul_dtype: str) -> TimeCorrection:
    """The correction the latest of ``runs`` (oldest first) say: the prior, then the part
    factors fitted toward it on the runs that recorded their parts."""
    recent = [r["ratio"] for r in runs[-RECENT_RUNS:]]
    prior = statistics.median(recent)
    fitted = [r for r in runs[-FIT_RUNS:] if r.get("modelled_parts")]
    return TimeCorrection(prior, len(recent), matmul_dtype,
                          fit_part_factors(fitted, prior), len(fitted))


def fit_part_factors(runs: list[dict], prior: float) -> dict[str, float]:
    """Per part, the factor minimising the runs' squared relative errors plus ``RIDGE``
    times each factor's squared distance from ``prior`` (in units of the prior)."""
    parts = sorted({p for r in runs for p, s in r["modelled_parts"].items() if s > 0})
    if not parts:
        return {}
    # normal equations of the ridge problem, in d = factor / prior - 1
    n = len(parts)
    lhs = [[RIDGE if i == j else 0.0 for j in range(n)] for i in range(n)]
    rhs = [0.0] * n
    for run in runs:
        x = [prior * run["modelled_parts"].get(p, 0.0) / run["measured_s"] for p in parts]
        residual = 1.0 - sum(x)  # what the prior leaves unexplained, relatively
        for i in range(n):
            rhs[i] += x[i] * residual
            for j in range(n):
                lhs[i][j] += x[i] * x[j]
    low, high = PART_FACTOR_BOUNDS
    return {p: prior * min(max(1.0 + d, low), high)
            for p, d in zip(parts, _solve(lhs, rhs), strict=True)}


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (``a`` is symmetric positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def record_run(calibration_file: Path, calibrated_at: str, *, matmul_dtype: str,
               modelled_s: float, measured_s: float, label: str,
               modelled_parts: dict[str, float] | None = None) -> TimeCorrection | None:
    """Add one run's measured time beside its modelled time (and the modelled time of each
    part, which the part factors are fitted on); the correction the next plans will use, or
    None if the ratio is out of bounds (not recorded)."""
    if modelled_s <= 0 or measured_s <= 0:
        return None
    ratio = measured_s / modelled_s
    if not RATIO_BOUNDS[0] <= ratio <= RATIO_BOUNDS[1]:
        return None
    path = correction_path(calibration_file)
    with exclusive_lock(path.with_suffix(".lock")):  # workers record concurrently
        runs = _read(path)
        runs.append({"calibrated_at": calibrated_at, "matmul_dtype": matmul_dtype,
                     "ratio": round(ratio, 5), "modelled_s": round(modelled_s, 5),
                     "measured_s": round(measured_s, 5), "label": label,
                     **({"modelled_parts": {p: round(t, 6) for p, t in modelled_parts.items()}}
                        if modelled_parts else {}),
                     "at": datetime.now(UTC).isoformat(timespec="seconds")})
        write_json_atomically(path, runs[-KEPT_RUNS:])
    return load_corrections(calibration_file, calibrated_at).get(matmul_dtype)


def _read(path: Path) -> list[dict]:
    try:
        runs = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except json.JSONDecodeError:
        return []  # a corrupt history only loses the correction, never a plan
    return runs if isinstance(runs, list) else []
