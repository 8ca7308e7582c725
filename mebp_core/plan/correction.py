"""What measured steps say about this host's step-time predictions.

After each training run the runner records its measured step time (the median of its steps
after the first, which also pays for first touches of the store) beside what the model
predicted for that configuration, part by part (matmul, decompression, elementwise traffic,
per-op overhead). Plans on this host then correct their step times per matmul dtype:

- the prior is one factor, the median measured/modelled ratio of the last few runs, so one
  run already moves every plan toward what was measured;
- a configuration's parts are corrected by the runs whose mix of modelled parts is most like
  its own: the parts the engine times itself (its dequantization) by the median of their
  measured/modelled ratios in those runs, every other part by the median ratio of what is
  left of their steps. Configurations differ in their mix of parts (a lazy one decompresses
  in tiles, a resident one does not) and in the code paths behind them, and a host may be
  slower than its calibration on one path only: measured on a Xeon with AMX, the rest of a
  lazy bfloat16 step ran 1.3-1.9x its model, a resident one's 1.0-1.15x (a 135M model's
  1.4-1.5x), so no one factor for the rest held both (BENCHMARKS, issue 14 item 2);
- runs are alike by their mix and by their size (a 135M model's overhead-bound step says
  little of a 1B model's), and what the nearest runs say is trusted less the further they
  are: their factors shrink toward the model's own prediction. A timed part's factor is the
  host's rate on that path against its calibration, which a model's size does not change:
  it is trusted by the mix alone (on a Xeon with AMX, the lazy configurations'
  dequantization ran 1.1-1.5x its model at every size from 135M to 1.2B parameters).

Runs are kept per calibration: a fresh calibration starts without a correction.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mebp_core.atomic import try_lock, write_json_atomically
from mebp_core.code_version import engine_code_digest
from mebp_core.errors import MebpError

RECENT_RUNS = 5  # the prior is the median over this many latest runs
# a configuration's part factors: from this many runs of the mix most like its own, among
# this many latest runs with timed parts
SIMILAR_RUNS = 2
SIMILAR_WINDOW = 8
# how much a run's size (its modelled step time) counts in its distance, per factor of e
SIZE_WEIGHT = 1.0
# part factors f become f ** exp(-d / TRUST_DISTANCE), d the nearest run's distance
TRUST_DISTANCE = 0.6
# the parts the engine clocks itself in every step (``StepMetrics.decompress_s``)
MEASURED_PARTS = ("decompress",)
# a timed part this small a share of a run's modelled step says little of its rate
MIN_PART_SHARE = 0.03
KEPT_RUNS = 50  # the history kept in the file, for inspection
# a run whose steps ran this far from the model's time says more about the run than the host
RATIO_BOUNDS = (0.01, 100.0)
# a recorder that holds the history's lock this long hangs (a stopped worker holds it for good)
RECORD_WAIT_S = 30.0


class CorrectionLockedError(MebpError):
    """Another process held the history's lock past ``RECORD_WAIT_S``: the run is not kept."""


@dataclass(frozen=True)
class TimeCorrection:
    """How plans correct their modelled step time, and what it rests on."""

    factor: float  # the prior: the median ratio of the latest runs
    runs: int  # how many measured runs the prior is the median of
    matmul_dtype: str
    timed: tuple[dict, ...] = ()  # the latest runs with timed parts, oldest first

    @property
    def timed_runs(self) -> int:
        return len(self.timed)

    def part_factors(self, modelled: dict[str, float]) -> dict[str, float]:
        """Per part of a configuration modelled as ``modelled`` (seconds by part): a part
        the engine timed, the median of its measured/modelled ratios in the most similar
        runs where it was a share worth timing; any other part, the median ratio of the
        rest of the most similar runs' steps. Empty without timed runs (the prior alone)."""
        def nearest(runs: Sequence[dict]) -> list[dict]:
            return sorted(runs, key=lambda r: _mix_distance(r["modelled_parts"], modelled)
                          )[:SIMILAR_RUNS]

        def trust(runs: Sequence[dict], size_weight: float = SIZE_WEIGHT) -> float:
            return math.exp(-min(_mix_distance(r["modelled_parts"], modelled, size_weight)
                                 for r in runs) / TRUST_DISTANCE)

        rest = [ratio for ratio in map(_rest_ratio, nearest(self.timed))
                if ratio is not None]
        if not rest:
            return {}
        factors = dict.fromkeys(modelled, statistics.median(rest) ** trust(self.timed))
        for part in MEASURED_PARTS:
            worth = [r for r in self.timed if part in r["measured_parts"] and
                     r["modelled_parts"].get(part, 0.0) > MIN_PART_SHARE * r["modelled_s"]]
            if worth and part in factors:
                # a timed part's ratio is the host's rate on that path against its
                # calibration, whatever the model's size: trusted by mix alone
                factors[part] = statistics.median(
                    r["measured_parts"][part] / r["modelled_parts"][part]
                    for r in nearest(worth)) ** trust(worth, size_weight=0.0)
        return factors

    def apply(self, time_by_part: dict[str, float],
              like: dict[str, float] | None = None) -> dict[str, float]:
        """``time_by_part`` corrected as the parts of a configuration modelled as ``like``
        (by default, ``time_by_part`` itself)."""
        factors = self.part_factors(like or time_by_part)
        return {part: seconds * factors.get(part, self.factor)
                for part, seconds in time_by_part.items()}

    def to_json(self) -> dict:
        return {"factor": round(self.factor, 4), "runs": self.runs,
                "matmul_dtype": self.matmul_dtype, "timed_runs": self.timed_runs}


def _mix_distance(a: dict[str, float], b: dict[str, float],
                  size_weight: float = SIZE_WEIGHT) -> float:
    """How far apart two configurations' modelled steps are: the distance of their shares of
    the step, beside the log of their sizes' ratio (``size_weight`` per factor of e)."""
    total_a, total_b = sum(a.values()) or 1.0, sum(b.values()) or 1.0
    mix = math.dist([a.get(p, 0.0) / total_a for p in sorted(a.keys() | b.keys())],
                    [b.get(p, 0.0) / total_b for p in sorted(a.keys() | b.keys())])
    return math.hypot(mix, size_weight * math.log(total_a / total_b))


def correction_path(calibration_file: Path) -> Path:
    """Runs of another version of the engine (another checkout sharing the cache, or this one
    before an edit) measured other code: each version learns its own correction."""
    return calibration_file.with_name(
        f"{calibration_file.stem}-time-correction-{engine_code_digest()}.json")


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
    """The correction the latest of ``runs`` (oldest first) say: the prior, and the latest
    runs that recorded their parts, which the part factors come from."""
    prior = statistics.median(r["ratio"] for r in runs[-RECENT_RUNS:])
    timed = [r for r in runs[-SIMILAR_WINDOW:]
             if r.get("modelled_parts") and r.get("measured_parts")]
    return TimeCorrection(prior, len(runs[-RECENT_RUNS:]), matmul_dtype, tuple(timed))


def _rest_ratio(run: dict) -> float | None:
    """Measured over modelled time of the step without its timed parts."""
    timed = [p for p in MEASURED_PARTS if p in run["measured_parts"]]
    modelled = run["modelled_s"] - sum(run["modelled_parts"].get(p, 0.0) for p in timed)
    measured = run["measured_s"] - sum(run["measured_parts"][p] for p in timed)
    return measured / modelled if modelled > 0 and measured > 0 else None


def record_run(calibration_file: Path, calibrated_at: str, *, matmul_dtype: str,
               modelled_s: float, measured_s: float, label: str,
               modelled_parts: dict[str, float] | None = None,
               measured_parts: dict[str, float] | None = None,
               run_id: str | None = None) -> TimeCorrection | None:
    """Add one run's measured time beside its modelled time, with the modelled time of each
    part and the measured time of those the engine timed (``MEASURED_PARTS``), which the
    part factors come from; the correction the next plans will use, or None if the ratio is
    out of bounds (not recorded). Raises ``CorrectionLockedError`` if another recorder
    hung holding the history. A run recorded again under its ``run_id`` replaces its
    earlier record: a caller may record before it commits its own, and again after a crash."""
    if modelled_s <= 0 or measured_s <= 0:
        return None
    ratio = measured_s / modelled_s
    if not RATIO_BOUNDS[0] <= ratio <= RATIO_BOUNDS[1]:
        return None
    path = correction_path(calibration_file)
    # workers record concurrently; a run left unrecorded beats a job that never ends
    with try_lock(path.with_suffix(".lock"), wait_s=RECORD_WAIT_S) as held:
        if not held:
            raise CorrectionLockedError(f"{path.with_suffix('.lock')} was held by another "
                                        f"process for {RECORD_WAIT_S:g} s")
        runs = [run for run in _read(path) if run_id is None or run.get("run_id") != run_id]
        runs.append({**({"run_id": run_id} if run_id is not None else {}),
                     "calibrated_at": calibrated_at, "matmul_dtype": matmul_dtype,
                     "ratio": round(ratio, 5), "modelled_s": round(modelled_s, 5),
                     "measured_s": round(measured_s, 5), "label": label,
                     **({"modelled_parts": {p: round(t, 6) for p, t in modelled_parts.items()}}
                        if modelled_parts else {}),
                     **({"measured_parts": {p: round(t, 6) for p, t in measured_parts.items()
                                            if p in MEASURED_PARTS}}
                        if measured_parts else {}),
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
