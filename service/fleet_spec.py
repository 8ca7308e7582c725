"""What a fleet keeps (``Fleet.spec``) and what each of its rounds records
(``FleetRound.participants``): validated as a row is loaded (``service.json_column``), so the
API, the preparation and the coordinator read attributes, never keys.

The round settings are defined here once; the request body (``app.fleet_schemas.FleetCreate``)
takes its fields from ``FleetRequest``. Rows written before a key existed load with its
default."""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mebp_core.config import Method, TrainConfig
from mebp_core.federated.split import SplitSpec
from service.job_plan import JobPlan

MAX_ROUNDS = 100
MAX_POPULATION = 10_000  # simulated phones in one fleet
MAX_COHORT = 256  # jobs a round (or a fleet without rounds) queues at most
Aggregation = Literal["none", "fedavg", "ffa"]
Outcome = Literal["training", "trained", "dropped", "out_of_memory", "straggler",
                  "does_not_fit", "failed", "cancelled"]


class Record(BaseModel):
    """A stored record: immutable (a change is a new value assigned, which the row saves).
    A key it does not know is ignored (``service.json_column``: rows written by a newer
    version load in an older one); a missing required key is an error naming it."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class StoredHyperparameters(BaseModel):
    """The request's hyperparameters as stored; the fleet itself reads only the steps."""

    model_config = ConfigDict(frozen=True, extra="allow")
    steps: int


class FleetRequest(BaseModel):
    """The fleet's request as it was made (``FleetCreate``, dumped): its fields the service
    reads are typed here, the others kept as they came."""

    model_config = ConfigDict(frozen=True, extra="allow")

    training_file: str
    validation_file: str | None = None
    method: Method = "mebp"
    hyperparameters: StoredHyperparameters
    seed: int = copy.copy(TrainConfig.model_fields["seed"])
    metadata: dict[str, str] = Field(default_factory=dict)
    aggregation: Aggregation = Field(default="none", description=(
        "none: independent jobs; fedavg: each round averages the devices' LoRA A and B "
        "weighted by their examples; ffa: A frozen at a shared seeded init, only B trained "
        "and averaged (the average is exact)"))
    rounds: int = Field(default=1, ge=1, le=MAX_ROUNDS, description="federated rounds")
    local_steps: int | None = Field(default=None, ge=1, le=100_000, description=(
        "steps each device trains per round (default: hyperparameters.steps)"))
    participation: float = Field(default=1.0, gt=0, le=1, description=(
        "the fraction of devices selected each round, sampled with the fleet's seed"))
    data_split: SplitSpec | None = None
    dropout: float = Field(default=0.0, ge=0, lt=1, description=(
        "the probability a selected device goes offline mid-round; its update is lost"))
    deadline_s: float | None = Field(default=None, gt=0, le=1e7, description=(
        "simulated on-device seconds a round may take; slower devices are stragglers and "
        "left out of the round"))
    device_validation_rows: int | None = Field(default=None, ge=1, le=100_000, description=(
        "score each device's round job on a sample of this many rows of validation_file "
        "(drawn with the fleet's seed); unset: device jobs skip validation, and each "
        "round's global adapter alone is scored, on all of it"))
    references: bool = Field(default=False, description=(
        "also train, from scratch and scored on validation_file, every device alone on its "
        "shard for as many steps as the rounds give it (local-only) and one run on the whole "
        "training file seeing as many examples as all the rounds' devices together "
        "(centralized): what the fleet's global adapter is measured against"))

    @property
    def federated(self) -> bool:
        return self.aggregation != "none"

    @property
    def steps_per_round(self) -> int:
        """Each selected device's local steps in a round."""
        return self.local_steps or self.hyperparameters.steps


# the round settings, which FleetCreate takes from here
ROUND_FIELDS = ("aggregation", "rounds", "local_steps", "participation", "dropout",
                "deadline_s", "device_validation_rows", "references")


class JobTemplate(Record):
    """A member's job as planned: the ``Job`` row each of its runs is made from."""

    model: str
    device_id: str | None
    memory_budget_bytes: int
    plan: JobPlan
    config: TrainConfig
    training_file: str | None  # its shard, once written
    validation_file: str | None
    metadata_: dict[str, str] = Field(default_factory=dict)

    def job_row(self, *, config: dict[str, Any] | None = None, **fields: Any
                ) -> dict[str, Any]:
        """The keyword arguments of its ``Job`` (``service.crud.create_queued_jobs``), with
        the settings in ``config`` (``TrainConfig``'s, validated) and any of ``fields``
        replaced."""
        train = self.config if not config else \
            TrainConfig.model_validate({**self.config.model_dump(), **config})
        return {**dict(self), "config": train, **fields}


class FleetMemberSpec(Record):
    """One device of the fleet: its plan and, if it runs, its job's template."""

    device: str
    shard: int | None
    training_file: str | None  # none for a device without a job, or before its shard
    fits: bool
    examples: int | None = None  # rows in its shard, once dealt: its weight in an average
    plan: JobPlan
    job: JobTemplate | None = None  # none: it does not fit, and allow_infeasible is off
    job_id: str | None = None  # a fleet without rounds: its one job


class ReferenceRecord(Record):
    kind: Literal["local_only", "centralized"]
    member: int | None = Field(description="local-only: the device, as an index into the "
                               "fleet's members")
    job_id: str


class Population(Record):
    """A simulated population: phones numbered in the order of its profiles (the first
    ``counts[0]`` are ``profiles[0]``'s, and so on), phone ``i`` holding shard ``i``. A phone
    is derived from its profile when read, so a fleet of 10,000 stores one plan a profile."""

    profiles: list[FleetMemberSpec]  # each profile's plan and job template, no shard yet
    counts: list[int]
    examples: list[int] | None = None  # rows in each phone's shard, once dealt

    def profile_of(self, index: int) -> FleetMemberSpec:
        for profile, count in zip(self.profiles, self.counts, strict=True):
            if index < count:
                return profile
            index -= count
        raise IndexError(f"no phone {index} in a population of {sum(self.counts)}")


class FleetSpec(Record):
    """Its members: a list of named devices (and fleets made before populations), or a
    simulated ``population``."""

    request: FleetRequest
    # none for a population; required, so a row without it is malformed, not an empty fleet
    members: list[FleetMemberSpec]
    population: Population | None = None
    references: list[ReferenceRecord] | None = None  # made with references: their jobs

    @property
    def member_count(self) -> int:
        return len(self.members) if self.population is None else sum(self.population.counts)

    @property
    def job_templates(self) -> list[JobTemplate]:
        """The jobs its members run, as planned (a population: one a profile)."""
        kinds = self.members if self.population is None else self.population.profiles
        return [member.job for member in kinds if member.job is not None]

    def member(self, index: int, fleet_id: str) -> FleetMemberSpec:
        """Member ``index``; a phone of a population with its shard's rows and file (the
        file is written when the phone first trains: ``service.shard_files``)."""
        if self.population is None:
            return self.members[index]
        population = self.population
        profile = population.profile_of(index)
        examples = None if population.examples is None else population.examples[index]
        shard = shard_id(fleet_id, index) if profile.job is not None else None
        job = None if profile.job is None else \
            profile.job.model_copy(update={"training_file": shard})
        return profile.model_copy(update={"shard": index, "examples": examples,
                                          "training_file": shard, "job": job})


def shard_id(fleet_id: str, index: int) -> str:
    """Member ``index``'s shard: the same id each time it is written, so writing it again
    (a second preparation, a round retried) writes over the first's file."""
    return f"ds-{fleet_id.removeprefix('fleet-')}-{index}"


class RoundSeat(Record):
    """A device a round selected, and what became of it."""

    member: int = Field(description="index into the fleet's members")
    job_id: str | None = Field(description="none when the device did not train this round")
    outcome: Outcome
    examples: int | None = Field(description="rows in the device's shard: its weight in the "
                                 "average (none when no device ran, so no rows were dealt)")
    offline_after_step: int | None = Field(description="dropout: the device went offline "
                                           "after this many local steps")
    device_time_s: float | None = Field(description="estimated on-device time of the round's "
                                        "local steps")
