"""The configuration an attempt of a job runs: the one the job was planned with, kept.

The API plans a job once, as it accepts it, and records the configuration on the job; every
attempt runs that configuration, so a job resumed from its checkpoint computes what an
uninterrupted run computes, bit for bit (the knobs are part of the arithmetic: a loss tile of
1M against 8M sums the logits in another order). Each attempt predicts that configuration
again with its own host's calibration at its own threads (the figures the job reports and
the time correction compare with), and plans afresh only where it is predicted not to fit
the job's budget on this host; it then says so (an event, and ``plan.replanned``), and the
new configuration is the one later attempts keep.

An attempt's own: its thread count (the worker's setting, else the cores free as it starts),
since on this engine the thread count does not change the results (1 and 2 threads gave
equal losses and adapters bit for bit on a 2-core host); and, fixed by the first attempt, the
bf16 matmul path its CPU takes for ``auto``.
"""

from __future__ import annotations

import os

from sqlmodel import Session

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.cpu import IdleWindow, matmul_dtype, threads_for_idle_cores
from mebp_core.plan.arch import Architecture, load_architecture
from mebp_core.plan.on_host import chosen_entry, plan_on_host, plan_summary
from mebp_core.plan.planner import Plan, PlanEntry
from mebp_core.plan.summary import PlanSummary, Replanned
from mebp_core.units import MB
from service.crud import add_event
from service.devices import find_device
from service.models import Job
from service.settings import Settings


def plan_on_this_worker(session: Session, job: Job, config: TrainConfig, source: str,
                        settings: Settings, worker: str,
                        idle: IdleWindow | None = None) -> TrainConfig:
    """The config this attempt runs: the job's recorded configuration (``config``) at this
    attempt's threads (from the cores ``idle`` since the attempt began), planned afresh
    only if predicted not to fit here. The job's config and plan are updated to match (the
    plan with this host's predictions)."""
    threads = attempt_threads(session, job, settings, idle or IdleWindow())
    session.commit()  # no write is held open while it plans (SQLite: the heartbeat waits)
    here = config.model_copy(update={"knobs": fixed_bf16_path(config).model_copy(
        update={"threads": threads})})
    planned = job.planned()
    if planned is not None:  # a job recorded unplanned keeps its knobs as asked
        here = _predict_here(session, job, planned, here, load_architecture(source), settings,
                             worker)
    job.config = here.model_dump(mode="json")
    session.add(job)
    return here


def _predict_here(session: Session, job: Job, planned: PlanSummary, here: TrainConfig,
                  arch: Architecture, settings: Settings, worker: str) -> TrainConfig:
    """``here`` predicted on this host and recorded as the job's plan; replaced by the
    fastest configuration that fits here only if the job's plan (``planned``) fitted its
    budget where it was made, was the planner's choice (not the request's) and is predicted
    not to fit here."""
    chosen_by = planned.chosen_by
    device = None if job.device_id is None else find_device(session, job.device_id)

    def plan_of(candidates: list[EngineKnobs] | None) -> Plan:
        # a missing calibration is measured (the worker measured its usual thread counts
        # as it started), an unsteady one is not measured again while a job waits on it
        return plan_on_host(arch, here, budget_bytes=job.memory_budget_bytes, device=device,
                            candidates=candidates, cache_dir=settings.cache_dir,
                            remeasure=False)

    plan = plan_of(None if chosen_by == "auto" else [here.knobs])
    recorded = _entry_of(plan, here.knobs) or plan_of([here.knobs]).entries[0]
    replan = chosen_by == "auto" and planned.feasible and recorded.feasible is False
    chosen = chosen_entry(plan) if replan else recorded
    # replanned by an earlier attempt: its configuration is the one kept
    replanned = _say_replanned(session, job, recorded, chosen, worker) if replan \
        else planned.replanned
    if replan:
        here = here.model_copy(update={"knobs": chosen.knobs.model_copy(
            update={"threads": here.knobs.threads})})
    job.plan = plan_summary(plan, chosen, chosen_by=chosen_by, predicted_by=worker,
                            replanned=replanned)
    return here


def _entry_of(plan: Plan, knobs: EngineKnobs) -> PlanEntry | None:
    """The plan's prediction of ``knobs`` (at whatever threads), if it is a candidate."""
    unthreaded = knobs.model_copy(update={"threads": None})
    return next((entry for entry in plan.entries
                 if entry.knobs.model_copy(update={"threads": None}) == unthreaded), None)


def _say_replanned(session: Session, job: Job, recorded: PlanEntry, chosen: PlanEntry,
                   worker: str) -> Replanned:
    """The event and the plan's record of a configuration replaced on this host."""
    record = Replanned(reason=f"{recorded.id} is predicted not to fit here: {recorded.reason}",
                       previous_configuration=recorded.id, worker=worker, attempt=job.attempts)
    add_event(session, job_id=job.id, kind="log",
              message=f"planned again on {worker}: {record.reason}; running {chosen.id} "
              f"(predicted {chosen.prediction.peak_bytes / MB:.0f} MB, "
              f"{chosen.prediction.step_time_s:.2f} s/step)",
              data={"configuration": chosen.id, **record.model_dump(mode="json")})
    return record


def fixed_bf16_path(config: TrainConfig) -> EngineKnobs:
    """``config``'s knobs with a bf16 matmul path of "auto" made the one this host's CPU
    takes, so every later attempt, on any host, runs the same matmuls."""
    knobs = config.knobs
    if knobs.bf16_matmul != "auto" or config.compute_dtype != "bfloat16":
        return knobs
    native = matmul_dtype(config.compute_dtype, "auto") == "bfloat16"
    return knobs.model_copy(update={"bf16_matmul": "native" if native else "float32"})


def attempt_threads(session: Session, job: Job, settings: Settings,
                    window: IdleWindow) -> int:
    """The worker's thread setting, else one thread per core free as the attempt starts
    (over ``window``, with an event saying how many were)."""
    if settings.threads:
        return settings.threads
    idle = window.idle_cores()
    threads = threads_for_idle_cores(idle)
    if idle is not None:
        add_event(session, job_id=job.id, kind="log",
                  message=f"running on {threads} thread{'s' * (threads > 1)}: {idle:.1f} of "
                  f"{os.cpu_count()} cores idle as it starts",
                  data={"threads": threads, "idle_cores": round(idle, 2)})
    return threads
