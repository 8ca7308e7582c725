"""Planning a training config on this host: the one entry point the CLI, the API, the worker
and the benchmarks call. It reads this host's calibration for the config's thread count
(measuring it first where allowed), predicts every candidate configuration, and says what a
run records about the one it chose."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from mebp_core.cache import default_cache_dir
from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.plan.arch import Architecture
from mebp_core.plan.calibration import CalibrationError, HostCalibration, load_calibration
from mebp_core.plan.devices import DeviceProfile
from mebp_core.plan.planner import (
    DEFAULT_MARGIN,
    InfeasibleBudgetError,
    Plan,
    PlanEntry,
    make_plan,
)
from mebp_core.plan.summary import PlanSummary, Replanned
from mebp_core.plan.workload import Workload, matmul_dtype_of
from mebp_core.units import MB


class CalibrationUnavailableError(CalibrationError):
    """This host is not calibrated yet and may not be measured here (inside a memory cap, or
    on a request: the service measures when it starts)."""


def plan_on_host(arch: Architecture, config: TrainConfig, *, budget_bytes: int | None = None,
                 device: DeviceProfile | None = None, margin: float = DEFAULT_MARGIN,
                 candidates: list[EngineKnobs] | None = None, cache_dir: Path | None = None,
                 measure: bool = True, remeasure: bool = True) -> Plan:
    """Every candidate configuration (or ``candidates``) of ``config``'s workload, predicted
    with this host's calibration at ``config.knobs.threads`` threads; bf16 matmuls take
    ``config.knobs.bf16_matmul``'s path. ``measure=False`` refuses to calibrate here,
    ``remeasure=False`` to measure an unsteady calibration again."""
    workload = Workload.from_config(arch, config)
    host = load_calibration(cache_dir or default_cache_dir(), config.knobs.threads,
                            measure=measure, remeasure=remeasure)
    if host is None:
        raise CalibrationUnavailableError(
            "this host's calibration is not measured yet and cannot be measured here")
    return _memoized_plan(workload, _Calibration(host.identity, host), budget_bytes, device,
                          margin, None if candidates is None else tuple(candidates),
                          config.knobs.bf16_matmul)


# Plans made on this host, by exactly what determines them: the workload (architecture and
# setting), the calibration (its every figure, provenance and time corrections: a new
# measurement or a newly recorded run makes a new plan), the budget, the device, the margin,
# the candidates and the bf16 path. A plan is immutable and shared by its callers.
PLAN_MEMO_ENTRIES = 32  # a plan of 656 configurations holds about 2.3 MB


@dataclass(frozen=True)
class _Calibration:
    """A calibration in a memo's key: known by its identity, which covers its content."""

    identity: str
    host: HostCalibration = field(compare=False)


@lru_cache(maxsize=PLAN_MEMO_ENTRIES)
def _memoized_plan(workload: Workload, calibration: _Calibration, budget_bytes: int | None,
                   device: DeviceProfile | None, margin: float,
                   candidates: tuple[EngineKnobs, ...] | None, bf16_matmul: str) -> Plan:
    return make_plan(workload, calibration.host, budget_bytes=budget_bytes, device=device,
                     margin=margin, knobs=None if candidates is None else list(candidates),
                     bf16_matmul=bf16_matmul)


def forget_plans() -> None:
    """Empty the memo of plans (a benchmark timing a first plan)."""
    _memoized_plan.cache_clear()


def fastest_fitting(plan: Plan, config: TrainConfig) -> TrainConfig:
    """``config`` with the knobs of the fastest configuration predicted to fit the plan's
    budget, keeping its own thread count; ``InfeasibleBudgetError`` when none does."""
    if plan.auto is None:
        raise InfeasibleBudgetError(plan)
    return config.model_copy(update={"knobs": plan.auto.knobs.model_copy(
        update={"threads": config.knobs.threads})})


def chosen_entry(plan: Plan) -> PlanEntry:
    """What a run with a budget uses: the fastest configuration predicted to fit, or the
    smallest when none does (the kernel's cap then decides)."""
    return plan.auto if plan.auto is not None else plan.smallest


def plan_summary(plan: Plan, chosen: PlanEntry, *, chosen_by: str,
                 predicted_by: str | None = None,
                 replanned: Replanned | None = None) -> PlanSummary:
    """What a job records about its plan: the chosen configuration's predictions beside
    the smallest budget and the calibration they came from."""
    prediction = chosen.prediction
    return PlanSummary(
        method=plan.workload.method, configuration=chosen.id, feasible=chosen.feasible,
        chosen_by=chosen_by,
        budget_mb=None if plan.budget_bytes is None else round(plan.budget_bytes / MB, 1),
        margin=plan.margin, matmul_dtype=matmul_dtype_of(plan.workload, chosen.knobs),
        predicted_peak_mb=round(prediction.peak_bytes / MB, 1),
        predicted_memory_mb={k: round(v / MB, 1) for k, v in prediction.memory.items()},
        predicted_step_time_s=round(prediction.step_time_s, 4),
        modelled_step_time_s=round(prediction.modelled_step_time_s, 4),
        modelled_time_s={k: round(v, 6) for k, v in prediction.modelled_time.items()},
        time_correction=round(prediction.time_factor, 4),
        device_step_time_s_estimate=None if chosen.device_step_time_s is None
        else round(chosen.device_step_time_s, 3),
        smallest_budget_mb=plan.smallest_budget_mb(),
        smallest_configuration=plan.smallest.id,
        dominant_component=plan.smallest.prediction.dominant_component(),
        calibration=plan.calibration, predicted_by=predicted_by, replanned=replanned)


def plan_job_run(arch: Architecture, config: TrainConfig, *, budget_bytes: int | None,
                 device: DeviceProfile | None, chosen_by: str, cache_dir: Path | None,
                 measure: bool = True) -> tuple[TrainConfig, PlanSummary, Plan]:
    """A service job's plan on this host, at ``config``'s thread count: ``config`` with the
    knobs it runs (the fastest configuration predicted to fit, or the smallest when none
    does; with ``chosen_by="request"``, its own knobs), the summary the job records, and
    the plan."""
    plan = plan_on_host(arch, config, budget_bytes=budget_bytes, device=device,
                        candidates=[config.knobs] if chosen_by == "request" else None,
                        cache_dir=cache_dir, measure=measure)
    chosen = chosen_entry(plan)
    runs = config.model_copy(update={"knobs": chosen.knobs.model_copy(
        update={"threads": config.knobs.threads})})
    return runs, plan_summary(plan, chosen, chosen_by=chosen_by), plan
