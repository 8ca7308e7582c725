"""Turning a job request into its training config and plan, or a 422 naming the field.

A budget the planner judges too small is refused with the smallest budget that would fit,
unless the request allows it: then the job runs and the kernel cap decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlmodel import Session

from app.api.errors import invalid, invalid_from
from app.job_schemas import JobCreate
from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.plan.arch import Architecture, PlanInputError
from mebp_core.plan.devices import DeviceProfile
from mebp_core.plan.on_host import plan_job_run
from mebp_core.plan.summary import PlanSummary
from mebp_core.plan.workload import Workload
from mebp_core.units import MB
from service.devices import find_device
from service.settings import Settings


@dataclass(frozen=True)
class PlannedJob:
    config: TrainConfig
    device: DeviceProfile | None
    budget_bytes: int
    plan: PlanSummary  # what the planner predicted for the chosen configuration
    feasible: bool = True  # False: predicted not to fit; `infeasible_error` explains

    def infeasible_error(self) -> RequestValidationError:
        """The 422 for a budget too small, with the smallest budget that fits."""
        smallest = self.plan.smallest_budget_mb
        return invalid(
            "memory_budget_mb",
            f"{'no configuration' if self.plan.chosen_by == 'auto' else 'the config given'}"
            f" is predicted to fit {self.budget_bytes / MB:.0f} MB (with the "
            f"{self.plan.margin:.0%} margin); the smallest budget that fits is "
            f"{smallest} MB ({self.plan.dominant_component} dominates). Raise the budget, "
            f"or set allow_infeasible to run it under the kernel cap anyway",
            round(self.budget_bytes / MB, 1), smallest_budget_mb=smallest)


def plan_job(body: JobCreate, arch: Architecture, settings: Settings,
             session: Session) -> PlannedJob:
    """The job's config with the knobs it runs with, and the planner's verdict on its budget
    (the fastest configuration that fits, or the smallest one when none does); ``arch`` is
    ``body.model``'s, resolved once by the caller (``app.submit.check_references``)."""
    device = device_or_422(session, body.device)
    budget_bytes = _budget_bytes(body, device)
    hyper = body.hyperparameters.model_dump()  # by TrainConfig's names
    hyper["checkpoint_every"] = body.hyperparameters.checkpoint_every or settings.checkpoint_every
    knobs = EngineKnobs() if body.config == "auto" else body.config
    try:
        config = TrainConfig(method=body.method, seed=body.seed, knobs=knobs, **hyper)
        Workload.from_config(arch, config)  # a seq_len past the context is a 422 here
    except ValidationError as exc:
        raise invalid_from(exc, ("hyperparameters",)) from None
    except PlanInputError as exc:
        raise invalid(("hyperparameters", "seq_len"), str(exc), config.seq_len) from None
    # predicted with this host's calibration and threads: the configuration chosen here is
    # the one every attempt runs (``worker.host_plan``), each at its own worker's threads
    here = config.model_copy(update={"knobs": knobs.model_copy(
        update={"threads": settings.plan_threads})})
    runs, summary, plan = plan_job_run(
        arch, here, budget_bytes=budget_bytes, device=device,
        chosen_by="auto" if body.config == "auto" else "request", cache_dir=settings.cache_dir,
        measure=False)  # measured when the service started (``app.calibration_gate``)
    config = runs.model_copy(update={"knobs": runs.knobs.model_copy(update={"threads": None})})
    return PlannedJob(config, device, budget_bytes, summary, feasible=plan.auto is not None)


def device_or_422(session: Session, device_id: str | None, *, field: str | tuple = "device",
                  where: str = "body") -> DeviceProfile | None:
    if device_id is None:
        return None
    device = find_device(session, device_id)
    if device is None:
        raise invalid(field, "unknown device profile (GET /v1/devices lists them)", device_id,
                      where=where)
    return device


def _budget_bytes(body: JobCreate, device: DeviceProfile | None) -> int:
    if body.memory_budget_mb is not None:
        return int(body.memory_budget_mb * MB)
    if device is not None and device.budget_bytes is not None:
        return device.budget_bytes
    field = "memory_budget_mb"
    why = "required" if device is None else f"required: device {device.id!r} sets no budget"
    raise invalid(field, f"{why} (or pick a device profile that has one)", None)
