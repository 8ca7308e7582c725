"""A fleet's members as planned: what a fleet request is checked for before planning, every
device's plan, made once per distinct device profile (a fleet's devices share its model,
workload and budget, so the device is all that differs), and the seats the fleet needs in its
tenant's queue."""

from __future__ import annotations

from sqlmodel import Session

from app.api.errors import invalid
from app.fleet_schemas import FleetCreate
from app.job_schemas import JobCreate
from app.planning import PlannedJob, device_or_422, plan_job
from mebp_core.config import MAX_STEPS
from mebp_core.federated.rounds import reference_steps, selected_count
from mebp_core.plan.arch import Architecture
from service.fleet_spec import MAX_COHORT, FleetMemberSpec, FleetSpec, JobTemplate, Population
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


def plan_members(session: Session, settings: Settings, body: FleetCreate, source: Dataset,
                 arch: Architecture) -> tuple[list[FleetMemberSpec], Population | None]:
    """The fleet's members: one per named device, or one per simulated phone, each with its
    plan and, if it runs (it fits, or ``allow_infeasible``), its job's row as a template; a
    federated simulated fleet, a ``Population`` instead (one planned member a profile, its
    phones derived). A device with its own shard has no training file yet (its shard is
    written only if it gets a job) nor a row count until the rows are dealt. ``arch`` is the
    model's, resolved once for the request (``check_references``)."""
    counts = body.simulated.counts() if body.simulated is not None else None
    profiles = {}
    for device in counts or dict.fromkeys(body.devices):
        planned = plan_job(member_job_body(body, device, source.id), arch, settings, session)
        profiles[device] = _planned_member(body, device, planned, source)
    if counts is not None and body.federated:
        return [], Population(profiles=list(profiles.values()), counts=list(counts.values()))
    devices = body.devices if counts is None else \
        [device for device, count in counts.items() for _ in range(count)]
    return [profiles[device].model_copy(update={"shard": index if body.shards_data else None})
            for index, device in enumerate(devices)], None


def _planned_member(body: FleetCreate, device: str, planned: PlannedJob, source: Dataset
                    ) -> FleetMemberSpec:
    training_file = None if body.shards_data else source.id
    template = None if not (planned.feasible or body.allow_infeasible) else JobTemplate(
        model=body.model, device_id=None if planned.device is None else planned.device.id,
        memory_budget_bytes=planned.budget_bytes, plan=planned.plan, config=planned.config,
        training_file=training_file, validation_file=body.validation_file,
        metadata_=body.metadata)
    return FleetMemberSpec(device=device, shard=None, training_file=training_file,
                           fits=planned.feasible,
                           examples=None if body.shards_data else source.rows,
                           plan=planned.plan, job=template)


def seats_needed(body: FleetCreate, spec: FleetSpec) -> int:
    """The most jobs the fleet has queued at once: one per device that runs; federated, its
    largest round (the devices a round selects, at most those that run) and its
    references. Held in the tenant's queue from its creation until its last round is
    queued, so no round passes the tenant's limit."""
    if spec.population is None:
        runs = sum(member.job is not None for member in spec.members)
    else:
        runs = sum(count for profile, count in zip(spec.population.profiles,
                                                   spec.population.counts, strict=True)
                   if profile.job is not None)
    if not body.federated:
        return runs
    references = runs + 1 if body.references and runs else 0
    return min(selected_count(spec.member_count, body.participation), runs) + references


def check_population(body: FleetCreate) -> None:
    """422 naming the setting that would queue more than ``MAX_COHORT`` jobs at once."""
    devices = body.simulated.count if body.simulated is not None else len(body.devices)
    if devices <= MAX_COHORT:
        return
    if not body.federated:
        raise invalid(("simulated", "count"), f"a fleet without rounds runs every phone at "
                      f"once, at most {MAX_COHORT}; a larger population trains in rounds "
                      "(aggregation fedavg or ffa), each round's cohort drawn by "
                      "participation", devices)
    if (cohort := selected_count(devices, body.participation)) > MAX_COHORT:
        raise invalid("participation", f"draws {cohort} of {devices} phones a round, more "
                      f"than {MAX_COHORT}: at most {MAX_COHORT / devices:.4g}",
                      body.participation)
    if body.references:
        raise invalid("references", f"references train every phone alone: at most "
                      f"{MAX_COHORT} phones, not {devices}", True)


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


def check_devices(session: Session, body: FleetCreate) -> int:
    """422 naming a profile that is not known; the fleet's number of devices."""
    simulated = body.simulated
    if simulated is None:
        for index, device in enumerate(body.devices):
            device_or_422(session, device, field=("devices", str(index)))
        return len(body.devices)
    if simulated.device is not None:
        device_or_422(session, simulated.device, field=("simulated", "device"))
    for device in simulated.mix or {}:
        device_or_422(session, device, field=("simulated", "mix", device))
    return simulated.count
