"""What measured steps say about this host's step-time predictions.

After each training run the runner records the ratio of its measured step time (the median
of its steps after the first, which also pays for first touches of the store) to what the
model predicted for that configuration. Plans on this host then scale their step times by
the median ratio of the last few runs with the same matmul dtype, so a host that is slower
(or busier) than its calibration says is predicted as measured. Ratios are kept per
calibration: a fresh calibration starts without a correction.
"""

from __future__ import annotations

import fcntl
import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

RECENT_RUNS = 5  # the correction is the median of this many latest runs' ratios
KEPT_RUNS = 50  # the history kept in the file, for inspection
# a run whose steps ran this far from the model's time says more about the run than the host
RATIO_BOUNDS = (0.01, 100.0)


@dataclass(frozen=True)
class TimeCorrection:
    """The factor plans multiply their modelled step time by, and what it rests on."""

    factor: float
    runs: int  # how many measured runs the factor is the median of
    matmul_dtype: str

    def to_json(self) -> dict:
        return {"factor": round(self.factor, 4), "runs": self.runs,
                "matmul_dtype": self.matmul_dtype}


def correction_path(calibration_file: Path) -> Path:
    return calibration_file.with_name(calibration_file.stem + "-time-correction.json")


def measured_step_time(step_times: list[float]) -> float | None:
    """A run's step time: the median of its steps after the first, or None with fewer than
    two steps (the first alone is not representative)."""
    later = step_times[1:]
    return statistics.median(later) if later else None


def load_corrections(calibration_file: Path, calibrated_at: str) -> dict[str, TimeCorrection]:
    """Per matmul dtype, the correction from the runs measured against this calibration."""
    runs = [r for r in _read(correction_path(calibration_file))
            if r.get("calibrated_at") == calibrated_at]
    corrections = {}
    for dtype in sorted({r["matmul_dtype"] for r in runs}):
        recent = [r["ratio"] for r in runs if r["matmul_dtype"] == dtype][-RECENT_RUNS:]
        corrections[dtype] = TimeCorrection(statistics.median(recent), len(recent), dtype)
    return corrections


def record_run(calibration_file: Path, calibrated_at: str, *, matmul_dtype: str,
               modelled_s: float, measured_s: float, label: str) -> TimeCorrection | None:
    """Add one run's measured/modelled ratio; the correction the next plans will use, or
    None if the ratio is out of bounds (not recorded)."""
    if modelled_s <= 0 or measured_s <= 0:
        return None
    ratio = measured_s / modelled_s
    if not RATIO_BOUNDS[0] <= ratio <= RATIO_BOUNDS[1]:
        return None
    path = correction_path(calibration_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:  # workers record concurrently
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = _read(path)
        runs.append({"calibrated_at": calibrated_at, "matmul_dtype": matmul_dtype,
                     "ratio": round(ratio, 5), "modelled_s": round(modelled_s, 5),
                     "measured_s": round(measured_s, 5), "label": label,
                     "at": datetime.now(UTC).isoformat(timespec="seconds")})
        _write(path, runs[-KEPT_RUNS:])
    return load_corrections(calibration_file, calibrated_at).get(matmul_dtype)


def _read(path: Path) -> list[dict]:
    try:
        runs = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except json.JSONDecodeError:
        return []  # a corrupt history only loses the correction, never a plan
    return runs if isinstance(runs, list) else []


def _write(path: Path, runs: list[dict]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(runs, indent=1))
    os.replace(tmp, path)
