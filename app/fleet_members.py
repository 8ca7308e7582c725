"""A fleet's members as planned: what a fleet request is checked for before planning, every
device's plan, made once per distinct device profile (a fleet's devices share its model,
workload and budget, so the device is all that differs), and the seats the fleet needs in its
tenant's queue."""

from __future__ import annotations

from sqlmodel import Session

from app.api.errors import invalid
from app.fleet_schemas import FleetCreate
from app.planning import PlannedJob, device_or_422, plan_job
from app.schemas import JobCreate
from mebp_core.config import MAX_STEPS
from mebp_core.federated.rounds import reference_steps, selected_count
from mebp_core.plan.arch import Architecture
from service.fleet_spec import FleetMemberSpec, JobTemplate
from service.models import Dataset
from service.settings import Settings

JOB_FIELDS = ("model", "validation_file", "memory_budget_mb", "method", "hyperparameters",
              "config", "seed", "metadata", "allow_infeasible")


def member_job_body(body: FleetCreate, device: str, training_file: str) -> JobCreate:
    """What each device's job asks for: a federated round's local steps, and for ffa only B
    trained (every device shares A's seeded init)."""
    common = {name: getattr(body, name) for name in JOB_FIELDS}
    if body.federated:
        update = {"steps": body.steps_per_round}
        if body.aggregation == "ffa":
            update["lora_freeze_a"] = True
        common["hyperparameters"] = body.hyperparameters.model_copy(update=update)
    return JobCreate(**common, training_file=training_file, device=device)


def plan_members(session: Session, settings: Settings, body: FleetCreate, devices: list[str],
                 source: Dataset, arch: Architecture) -> list[FleetMemberSpec]:
    """One member per device: its plan and, if it runs (it fits, or ``allow_infeasible``),
    its job's row as a template. A device with its own shard has no training file yet (its
    shard is written only if it gets a job) nor a row count until the rows are dealt.
    ``arch`` is the model's, resolved once for the request (``check_references``)."""
    plans: dict[str, PlannedJob] = {}
    for device in dict.fromkeys(devices):
        plans[device] = plan_job(member_job_body(body, device, source.id), arch, settings,
                                 session)
    members = []
    for index, device in enumerate(devices):
        planned = plans[device]
        training_file = None if body.shards_data else source.id
        plan = planned.plan
        template = None if not (planned.feasible or body.allow_infeasible) else JobTemplate(
            model=body.model, device_id=None if planned.device is None else planned.device.id,
            memory_budget_bytes=planned.budget_bytes, plan=plan, config=planned.config,
            training_file=training_file, validation_file=body.validation_file,
            metadata_=body.metadata)
        members.append(FleetMemberSpec(
            device=device, shard=index if body.shards_data else None,
            training_file=training_file, fits=planned.feasible,
            examples=None if body.shards_data else source.rows, plan=plan, job=template))
    return members


def seats_needed(body: FleetCreate, members: list[FleetMemberSpec]) -> int:
    """The most jobs the fleet has queued at once: one per device that runs; federated, its
    largest round (the devices a round selects, at most those that run) and its
    references. Held in the tenant's queue from its creation until its last round is
    queued, so no round passes the tenant's limit."""
    runs = sum(member.job is not None for member in members)
    if not body.federated:
        return runs
    references = runs + 1 if body.references and runs else 0
    return min(selected_count(len(members), body.participation), runs) + references


def check_round_settings(body: FleetCreate, devices: int) -> None:
    """422 naming a round setting that would do nothing or cannot work."""
    if idle := body.federated_fields_without_aggregation():
        raise invalid(idle[0], f"{idle[0]} needs aggregation fedavg or ffa",
                      getattr(body, idle[0]))
    if body.device_validation_rows is not None and body.validation_file is None:
        raise invalid("device_validation_rows", "device_validation_rows samples "
                      "validation_file, which is not set", body.device_validation_rows)
    if body.references:
        check_references_can_run(body, devices)


def check_references_can_run(body: FleetCreate, devices: int) -> None:
    if body.validation_file is None:
        raise invalid("references", "references need validation_file: every reference and "
                      "every round's global adapter are scored on it", True)
    steps = reference_steps(devices, body.participation, body.rounds, body.steps_per_round)
    if max(steps) > MAX_STEPS:
        raise invalid("references", f"the centralized reference would train {max(steps)} "
                      f"steps, more than {MAX_STEPS}", True)


def device_ids(session: Session, body: FleetCreate) -> list[str]:
    if body.simulated is not None:
        device_or_422(session, body.simulated.device, field=("simulated", "device"))
        return [body.simulated.device] * body.simulated.count
    for index, device in enumerate(body.devices):
        device_or_422(session, device, field=("devices", str(index)))
    return body.devices
