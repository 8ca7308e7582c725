"""Starting a comparison: each method planned once on the device, then one normal job per
method and learning rate, written with the comparison in one transaction and only then
enqueued.

A method the planner predicts will not fit the budget gets no job: the comparison records it
as ``does_not_fit`` (with its smallest budget) and runs the others; only when no method fits
is the request refused, a 422 naming each method's smallest budget (``allow_infeasible`` runs
them all under the kernel cap). With ``max_device_time_s``, a method whose plan has no
device estimate cannot turn that time into steps: it is recorded ``no_device_estimate``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable

from fastapi import HTTPException, status
from redis import Redis
from sqlmodel import Session, select

from app.api.errors import invalid
from app.comparison_schemas import ComparisonCreate, LearningRates
from app.job_schemas import JobCreate
from app.planning import PlannedJob, device_or_422, plan_job
from app.submit import (
    check_references,
    insert_job,
    lock_queue,
    require_queue,
    require_queue_room,
)
from app.training_schemas import Hyperparameters
from mebp_core.config import MAX_STEPS, Method, TrainConfig
from mebp_core.plan.arch import Architecture
from mebp_core.units import MB
from service.comparison_spec import ComparisonRequest, ComparisonSpec, MethodRecord
from service.models import Comparison, Job
from service.settings import Settings
from service.storage import new_id

EVALUATIONS_PER_JOB = 10  # the default eval_every: a tenth of a job's steps


def job_body(body: ComparisonCreate, method: Method, learning_rate: float, steps: int,
             eval_every: int | None) -> JobCreate:
    """The job one method at one learning rate is: the comparison's shared settings,
    ``config: "auto"`` at the device's budget."""
    shared = body.hyperparameters.model_dump(by_alias=True, exclude_unset=True)
    return JobCreate(
        model=body.model, training_file=body.training_file,
        validation_file=body.validation_file, device=body.device,
        memory_budget_mb=body.memory_budget_mb, method=method, config="auto", seed=body.seed,
        metadata=body.metadata, allow_infeasible=body.allow_infeasible,
        hyperparameters=Hyperparameters(**shared, steps=steps, learning_rate=learning_rate,
                                        eval_every=eval_every))


@dataclasses.dataclass
class MethodPlan:
    method: Method
    planned: PlannedJob
    verdict: str  # runs, does_not_fit, no_device_estimate
    steps: int | None
    reason: str | None = None

    def record(self) -> MethodRecord:
        """What the comparison keeps of it (``Comparison.spec.methods``)."""
        plan = self.planned.plan
        return MethodRecord(method=self.method, verdict=self.verdict, reason=self.reason,
                            steps=self.steps, budget_mb=round(self.planned.budget_bytes / MB, 1),
                            smallest_budget_mb=plan.smallest_budget_mb,
                            predicted_peak_mb=plan.predicted_peak_mb,
                            device_step_time_s_estimate=plan.device_step_time_s_estimate)


def plan_method(session: Session, settings: Settings, body: ComparisonCreate,
                method: Method, arch: Architecture) -> MethodPlan:
    """The method planned once (the learning rate changes neither memory nor time), and
    the steps its jobs train under the comparison's limit."""
    planned = plan_job(job_body(body, method, body.rates_of(method)[0], body.max_steps or 1,
                                None), arch, settings, session)
    budget_mb = planned.budget_bytes / MB
    if not planned.feasible and not body.allow_infeasible:
        return MethodPlan(method, planned, "does_not_fit", None, (
            f"{method} is predicted not to fit {budget_mb:.0f} MB; its smallest budget is "
            f"{planned.plan.smallest_budget_mb} MB"))
    if body.max_steps is not None:
        return MethodPlan(method, planned, "runs", body.max_steps)
    estimate = planned.plan.device_step_time_s_estimate
    if not estimate:
        return MethodPlan(method, planned, "no_device_estimate", None, (
            f"no on-device step-time estimate for {method} on {body.device}: "
            "max_device_time_s cannot be turned into steps (give max_steps instead)"))
    steps = min(MAX_STEPS, max(1, int(body.max_device_time_s // estimate)))
    return MethodPlan(method, planned, "runs", steps)


def refuse_when_none_runs(body: ComparisonCreate, methods: list[MethodPlan]) -> None:
    if any(plan.verdict == "runs" for plan in methods):
        return
    if all(plan.verdict == "no_device_estimate" for plan in methods):
        raise invalid("max_device_time_s", methods[0].reason, body.max_device_time_s)
    smallest = {plan.method: plan.planned.plan.smallest_budget_mb for plan in methods}
    needs = ", ".join(f"{method} {mb} MB" for method, mb in smallest.items())
    raise invalid("methods", f"no method is predicted to fit "
                  f"{methods[0].planned.budget_bytes / MB:.0f} MB (the smallest budgets: "
                  f"{needs}); raise memory_budget_mb, pick another device, or set "
                  "allow_infeasible to run them under the kernel cap anyway", body.methods,
                  smallest_budget_mb=smallest)


def check_fields(body: ComparisonCreate) -> None:
    """What one field alone cannot say: one limit, each method once, rates for a method
    that runs."""
    if body.max_steps is None and body.max_device_time_s is None:
        raise invalid("max_steps", "give a limit: max_steps or max_device_time_s", None)
    if body.max_steps is not None and body.max_device_time_s is not None:
        raise invalid("max_device_time_s", "give one limit: max_steps or max_device_time_s, "
                      "not both", body.max_device_time_s)
    if len(set(body.methods)) != len(body.methods):
        raise invalid("methods", "each method once", body.methods)
    for method in LearningRates.model_fields:
        if getattr(body.learning_rates, method) is not None and method not in body.methods:
            raise invalid(("learning_rates", method), f"learning rates for {method}, which is "
                          f"not among methods {body.methods}", getattr(body.learning_rates,
                                                                       method))


def check_job_count(body: ComparisonCreate, settings: Settings) -> int:
    """The jobs the comparison would queue; a 422 when they alone pass the tenant's
    queue limit (a 429 later says when the queue is merely full now)."""
    count = sum(len(body.rates_of(method)) for method in body.methods)
    limit = settings.max_queued_jobs_per_tenant
    if count > limit:
        raise invalid("learning_rates", f"{count} jobs (methods x learning rates) pass the "
                      f"tenant's limit of {limit} queued jobs "
                      "(MEBP_MAX_QUEUED_JOBS_PER_TENANT): try fewer learning rates", count)
    return count


def body_sha256(body: ComparisonCreate) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def find_by_idempotency_key(session: Session, tenant: str, key: str,
                            body: ComparisonCreate) -> Comparison | None:
    """The comparison a request with ``key`` made, if any; a 409 for another body."""
    found = session.exec(select(Comparison).where(Comparison.tenant == tenant,
                                                  Comparison.idempotency_key == key)).first()
    if found is not None and found.request_sha256 != body_sha256(body):
        raise HTTPException(status.HTTP_409_CONFLICT, f"Idempotency-Key {key!r} was used for "
                            "a different request body; use a new key")
    return found


def submit_comparison(session: Session, body: ComparisonCreate, settings: Settings,
                      enqueue: Callable[[str], None], *, tenant: str, redis: Redis,
                      idempotency_key: str | None = None) -> Comparison:
    """Plan each method and queue its jobs with the comparison, all or nothing."""
    check_fields(body)
    arch = check_references(session, job_body(body, body.methods[0], 1e-3, 1, None), tenant)
    device = device_or_422(session, body.device)
    count = check_job_count(body, settings)
    require_queue(redis)
    require_queue_room(session, settings, tenant=tenant, adding=count)
    methods = [plan_method(session, settings, body, method, arch) for method in body.methods]
    refuse_when_none_runs(body, methods)
    request = ComparisonRequest.model_validate(body.model_dump(mode="json"))
    comparison = Comparison(
        id=new_id("cmp"), tenant=tenant, model=body.model, device_id=device.id,
        spec=ComparisonSpec(request=request, methods=[plan.record() for plan in methods]),
        idempotency_key=idempotency_key,
        request_sha256=None if idempotency_key is None else body_sha256(body))
    lock_queue(session, tenant)
    session.add(comparison)
    jobs = [_insert(session, body, plan, rate, comparison.id, tenant)
            for plan in methods if plan.verdict == "runs" for rate in body.rates_of(plan.method)]
    require_queue_room(session, settings, tenant=tenant, adding=0)  # exact, under the lock
    session.commit()
    for job in jobs:
        enqueue(job.id)
    session.refresh(comparison)
    return comparison


def _insert(session: Session, body: ComparisonCreate, plan: MethodPlan, learning_rate: float,
            comparison_id: str, tenant: str) -> Job:
    eval_every = body.eval_every or max(1, plan.steps // EVALUATIONS_PER_JOB)
    config = TrainConfig.model_validate({
        **plan.planned.config.model_dump(), "steps": plan.steps, "lr": learning_rate,
        "eval_every": min(eval_every, plan.steps)})
    job = job_body(body, plan.method, learning_rate, plan.steps, config.eval_every)
    return insert_job(session, job, dataclasses.replace(plan.planned, config=config),
                      tenant=tenant, comparison_id=comparison_id)
