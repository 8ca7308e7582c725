"""A finished job's measured step time against its plan, fed back into this host's time
correction (``mebp_core.plan.correction``) so the next plans move toward what was measured."""

from __future__ import annotations

from pathlib import Path

from mebp_core.plan.calibration import calibration_path, load_calibration
from mebp_core.plan.correction import (
    SIMILAR_RUNS,
    CorrectionLockedError,
    measured_step_time,
    record_run,
)
from mebp_core.plan.summary import PlanSummary
from service.models import Job


def predicted_figures(plan: PlanSummary | None) -> dict:
    """What the plan predicted for every step, to keep beside each step's measurement."""
    if plan is None:
        return {}
    return {"predicted_step_time_s": plan.predicted_step_time_s,
            "predicted_peak_mb": plan.predicted_peak_mb}


def correct_host_time(job: Job, *, cache_dir: Path, threads: int | None,
                      decompress_times: list[float | None] = ()
                      ) -> tuple[str, dict] | None:
    """Record the job's measured/modelled step-time ratio against this worker's calibration
    at ``threads``, if the job was planned with that same calibration and measured over two
    steps or more, with the engine's own time on decompression in those steps
    (``decompress_times``, one per step, taken as the step time is; not recorded if a step
    lacks it). Returns the job's event saying what the measurement did to this host's
    plans, or None when it had nothing to compare with. Recorded again for the same job (an
    attempt that died before committing its end, run again), it replaces the earlier record.

    It waits on the correction's lock, which another worker holds while it records (or
    hangs doing so: then at most ``correction.RECORD_WAIT_S``): call it before the session's first
    write, never with one held open."""
    decompress_s = None if None in decompress_times else measured_step_time(decompress_times)
    plan = job.planned()
    modelled = None if plan is None else plan.modelled_step_time_s
    if not modelled or job.step_time_s is None:
        return None
    host = load_calibration(cache_dir, threads, measure=False)
    calibrated_at = plan.calibrated_at or ""
    if host is None or host.measured_at != calibrated_at:
        return None  # planned elsewhere, or against a calibration since replaced
    measured = f"measured {job.step_time_s:.3g} s/step against " \
        f"{plan.predicted_step_time_s:.3g} predicted"
    data = {"measured_step_time_s": job.step_time_s,
            "predicted_step_time_s": plan.predicted_step_time_s}
    try:
        correction = record_run(calibration_path(cache_dir, threads), calibrated_at,
                                matmul_dtype=plan.matmul_dtype, modelled_s=modelled,
                                measured_s=job.step_time_s,
                                modelled_parts=plan.modelled_time_s,
                                measured_parts=None if decompress_s is None
                                else {"decompress": decompress_s},
                                label=f"job {job.id}: {job.model} {plan.configuration}",
                                run_id=job.id)  # one record per job, whichever attempt ends it
    except CorrectionLockedError as exc:
        return f"{measured}: not recorded in this host's time correction ({exc})", data
    if correction is None:
        return (f"{measured}, {job.step_time_s / modelled:.3g}x the model: not used to "
                "correct this host's plans (a run this far off says more about the run, "
                "such as the load beside it, than about the host)"), data
    modelled_parts = plan.modelled_time_s or {"step": modelled}
    corrected = sum(correction.apply(modelled_parts).values())
    return (f"{measured}; this host's {correction.matmul_dtype} plans are now corrected "
            f"by its measured runs: this configuration to {corrected:.3g} s/step "
            f"(x{corrected / modelled:.2f} its model; x{correction.factor:.2f} over the "
            f"latest {correction.runs} runs"
            + (f", its parts by the {min(SIMILAR_RUNS, correction.timed_runs)} of "
               f"{correction.timed_runs} timed runs most like it"
               if correction.timed_runs else "") + ")",
            {**data, "time_correction": correction.to_json(),
             "part_factors": correction.part_factors(modelled_parts)})
