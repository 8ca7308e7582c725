"""Fleet request and response bodies: devices, data splits and federated rounds."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from app.api.request_model import RequestModel
from app.common_schemas import Metadata, Name, WebhookUrl
from app.fleet_status import FleetStatus
from app.training_schemas import EngineKnobs, Hyperparameters
from mebp_core.config import Method, TrainConfig
from service.fleet_spec import (
    MAX_COHORT,
    MAX_POPULATION,
    Aggregation,
    FleetRequest,
    ReferenceRecord,
    RoundSeat,
)

# the round settings are the stored request's own fields (``service.fleet_spec``)
ROUND = FleetRequest.model_fields


class SimulatedDevices(RequestModel):
    """A population of phones, each trained on its own shard: of one profile, or a mix of
    profiles with shares (phones numbered in the mix's order, each profile's count its share
    rounded so that the counts add up)."""

    device: Name | None = Field(default=None, description="the profile of every phone")
    mix: dict[Name, float] | None = Field(
        default=None, min_length=1, max_length=64, examples=[
            {"iphone-15": 0.4, "pixel-8": 0.3, "android-4gb": 0.3}],
        description="the profiles' shares of the population, summing to 1")
    count: int = Field(ge=1, le=MAX_POPULATION, description=(
        f"phones (at most {MAX_POPULATION}; over {MAX_COHORT} only in rounds, "
        f"whose participation draws cohorts of at most {MAX_COHORT})"))

    @field_validator("mix")
    @classmethod
    def _shares_sum_to_one(cls, mix: dict[str, float] | None) -> dict[str, float] | None:
        if mix is None:
            return None
        if any(not 0 < share <= 1 for share in mix.values()):
            raise ValueError("every share must be in (0, 1]")
        if abs(sum(mix.values()) - 1) > 1e-6:
            raise ValueError(f"the shares sum to {sum(mix.values()):g}, not 1")
        return mix

    @model_validator(mode="after")
    def _one_profile_or_a_mix(self) -> SimulatedDevices:
        if (self.device is None) == (self.mix is None):
            raise ValueError("give exactly one of device (one profile) and mix (shares)")
        return self

    def counts(self) -> dict[str, int]:
        """Phones per profile: each share of ``count`` rounded down, the phones left over
        given to the largest remainders (the mix's order breaks ties)."""
        shares = self.mix or {self.device: 1.0}
        exact = {profile: share * self.count for profile, share in shares.items()}
        counts = {profile: int(value) for profile, value in exact.items()}
        left = self.count - sum(counts.values())
        by_remainder = sorted(exact, key=lambda p: counts[p] - exact[p])  # stable
        for profile in by_remainder[:left]:
            counts[profile] += 1
        return {profile: n for profile, n in counts.items() if n}


class DataSplit(RequestModel):
    """How a fleet's rows are dealt to its devices (each device holds only its shard)."""

    kind: Literal["iid", "by_field", "dirichlet"] = Field(default="iid", description=(
        "iid: shuffled and dealt evenly; by_field: all rows with the same value of `field` "
        "(a user, a source) on one device; dirichlet: each value of the label `field` "
        "shared among devices by Dirichlet(alpha) draws"))
    field: str | None = Field(default=None, min_length=1, max_length=128)
    alpha: float | None = Field(default=None, gt=0, le=1e6, description="dirichlet only: "
                                "small concentrates each label on few devices")

    @model_validator(mode="after")
    def _what_each_kind_needs(self) -> DataSplit:
        if self.kind != "iid" and self.field is None:
            raise ValueError(f"{self.kind} needs field")
        if (self.kind == "dirichlet") != (self.alpha is not None):
            raise ValueError("alpha goes with dirichlet, and only with it")
        return self


class FleetCreate(RequestModel):
    """One model and dataset across device profiles, or across N simulated phones of one
    profile each holding its own shard of the data: one job per device, or, federated, one
    job per selected device per round, every round starting from the global adapter the
    previous one combined."""

    model: Name = Field(examples=["preset:qwen2.5-0.5b"])
    training_file: Name
    validation_file: Name | None = None
    devices: list[Name] | None = Field(default=None, min_length=1, max_length=64,
                                      examples=[["iphone-15-pro-max", "pixel-8"]])
    simulated: SimulatedDevices | None = None
    memory_budget_mb: float | None = Field(default=None, gt=0, le=1 << 20,
                                           description="overrides every device's budget")
    method: Method = "mebp"
    hyperparameters: Hyperparameters = Hyperparameters()
    config: Literal["auto"] | EngineKnobs = "auto"
    seed: int = copy.copy(TrainConfig.model_fields["seed"])
    metadata: Metadata = Field(default_factory=dict)
    allow_infeasible: bool = Field(default=False, description="also run the devices the "
                                   "planner predicts will not fit (the kernel cap decides)")
    aggregation: Aggregation = copy.copy(ROUND["aggregation"])
    rounds: int = copy.copy(ROUND["rounds"])
    local_steps: int | None = copy.copy(ROUND["local_steps"])
    participation: float = copy.copy(ROUND["participation"])
    data_split: DataSplit | None = Field(default=None, description=(
        "how rows are dealt to devices (default iid for simulated and federated fleets; "
        "a fleet of profiles without aggregation trains every device on all rows)"))
    dropout: float = copy.copy(ROUND["dropout"])
    deadline_s: float | None = copy.copy(ROUND["deadline_s"])
    device_validation_rows: int | None = copy.copy(ROUND["device_validation_rows"])
    references: bool = copy.copy(ROUND["references"])
    webhook_url: WebhookUrl | None = Field(default=None, description=(
        "where each round's end and the fleet's end are POSTed, signed (README: Webhooks); "
        "http or https, not this service itself"))

    @model_validator(mode="after")
    def _one_way_to_name_devices(self) -> FleetCreate:
        if (self.devices is None) == (self.simulated is None):
            raise ValueError("give exactly one of devices (profile ids) and simulated "
                             "({device or mix, count})")
        return self

    def federated_fields_without_aggregation(self) -> list[str]:
        """The round settings given to a fleet that does not aggregate (they would do
        nothing)."""
        if self.aggregation != "none":
            return []
        given = {"rounds": self.rounds != 1, "local_steps": self.local_steps is not None,
                 "participation": self.participation != 1.0, "dropout": self.dropout != 0.0,
                 "deadline_s": self.deadline_s is not None,
                 "device_validation_rows": self.device_validation_rows is not None,
                 "references": self.references}
        return [name for name, set_ in given.items() if set_]

    @property
    def steps_per_round(self) -> int:
        """Each selected device's local steps in a round."""
        return self.local_steps or self.hyperparameters.steps

    @property
    def federated(self) -> bool:
        return self.aggregation != "none"

    @property
    def shards_data(self) -> bool:
        """Each device holds its own shard rather than all rows."""
        return self.simulated is not None or self.federated or self.data_split is not None


class FleetMember(BaseModel):
    index: int = Field(description="the member's number in the fleet, from 0")
    device: str
    shard: int | None = Field(description="which shard of the data (simulated fleets)")
    training_file: str | None = Field(description="none for a device that gets no job (its "
                                      "shard is not written) or while the fleet is preparing")
    fits: bool = Field(description="the planner predicts a configuration fits the budget")
    budget_mb: float
    smallest_budget_mb: int | None
    configuration: str | None = Field(description="the configuration planned for the device "
                                      "(another only if its worker re-planned it: plan.replanned)")
    predicted_peak_mb: float | None
    measured_peak_mb: float | None = Field(description="the kernel's count: anonymous + "
                                           "shared memory at the job's peak")
    predicted_step_time_s: float | None = Field(description="on this service's host")
    measured_step_time_s: float | None
    device_step_time_s_estimate: float | None
    job_id: str | None = Field(description="none when the device does not fit and "
                               "allow_infeasible is off")
    status: str = Field(description="the job's status, not_run, or preparing while the "
                        "fleet is")
    final_loss: float | None
    error_code: str | None


LISTED_MEMBERS = 256  # members a fleet's body lists; its members page has them all


class FleetSummary(BaseModel):
    devices: int
    by_device: dict[str, int] = Field(description="members per device profile")
    fit: int
    by_status: dict[str, int]
    failures_by_code: dict[str, int]
    final_loss: dict[str, float] | None = Field(description=(
        "the training loss after each device's last step (a federated fleet's: in its latest "
        "round): mean, min and max over its succeeded jobs; a federated fleet's global "
        "validation loss is its rounds' eval_loss"))


class RoundParticipant(RoundSeat):
    """A round's seat as stored, with its device's name."""

    device: str


class Spread(BaseModel):
    """How a figure spreads over a round's cohort."""

    min: float
    median: float
    mean: float
    max: float


class RoundSummary(BaseModel):
    cohort: int = Field(description="the phones the round drew")
    outcomes: dict[str, int] = Field(description="how many came to each outcome")
    final_loss: Spread | None = Field(description="the training loss after the last step of "
                                      "each job that ended, over the cohort")
    measured_peak_mb: Spread | None = Field(description="the kernel's count of each job's "
                                            "peak (anonymous + shared memory)")
    device_time_s: Spread | None = Field(description="each phone's estimated on-device time "
                                         "for the round's local steps")


class FleetRoundPublic(BaseModel):
    index: int
    status: Literal["running", "done", "failed"] = Field(description="failed: no device "
                                                         "finished, the global adapter is "
                                                         "the previous round's")
    participants: list[RoundParticipant]
    eval_loss: float | None = Field(description="the global adapter's validation loss")
    simulated_wall_s: float | None = Field(description="the slowest participant's estimated "
                                           "on-device time")
    host_wall_s: float | None = Field(description="this host's time for the round")
    started_at: datetime
    finished_at: datetime | None
    summary: RoundSummary


class FleetRoundsPublic(BaseModel):
    data: list[FleetRoundPublic]
    count: int
    next: str | None = Field(description="the next page's URL, also in the Link header")


class FleetMembersPublic(BaseModel):
    data: list[FleetMember]
    count: int
    next: str | None = Field(description="the next page's URL, also in the Link header")


class ReferenceRun(ReferenceRecord):
    steps: int
    status: str
    eval_loss: float | None = Field(description="the validation loss after its last step, "
                                    "on the fleet's validation set")


class FleetReferences(BaseModel):
    local_only_mean: float | None = Field(description="the mean over the devices' local-only "
                                          "runs that succeeded, once all have ended")
    centralized: float | None
    runs: list[ReferenceRun]
    schedule: str = Field(description=(
        "when they train: a round's queued jobs are claimed before them, so they run on "
        "workers no round job is waiting for; e.g. 'queued behind round 2', 'running (1 "
        "running, 2 of 3 done)', 'done'"))


class FleetPublic(BaseModel):
    id: str
    object: Literal["fleet"] = "fleet"
    model: str
    method: str
    aggregation: str
    created_at: datetime
    status: FleetStatus = Field(description=(
        "preparing: a worker is dealing its rows into its devices' shards (a training file "
        "too large to split within the request); running: a job of it (a device's, a "
        "round's, a reference's) has not ended, or a federated fleet has rounds to come; "
        "cancelled: asked to cancel, nothing of it runs any more and it stopped short (a "
        "federated fleet after the round in progress at the cancel, whose global adapter it "
        "keeps; cancelled while preparing, nothing of it was queued); done: it ran all it "
        "planned and a round combined a global adapter (without rounds: a job succeeded); "
        "failed: its preparation failed (error says why, nothing of it was queued), or it "
        "came to nothing: every round failed, or no job succeeded (or no device fit)"))
    cancel_requested: bool = Field(description=(
        "asked to cancel: a federated fleet still running finishes the round in progress, "
        "then reads cancelled"))
    error: str | None = Field(description="why its preparation failed")
    members: list[FleetMember] = Field(description=(
        f"its first {LISTED_MEMBERS} members (a fleet of up to {LISTED_MEMBERS}, all); "
        "GET /v1/fleets/{id}/members pages them all; summary.devices counts them"))
    summary: FleetSummary
    planned_rounds: int | None = Field(description="federated: the rounds asked for")
    local_steps: int | None = Field(description="federated: each device's steps per round")
    rounds: list[FleetRoundPublic] = Field(description="federated fleets, round by round")
    references: FleetReferences | None = Field(description="federated fleets created with "
                                               "references")
    metadata: dict
    webhook_url: str | None = Field(default=None, description=(
        "where each round's end and the fleet's end are POSTed"))


class FleetsPublic(BaseModel):
    data: list[FleetPublic]
    count: int
