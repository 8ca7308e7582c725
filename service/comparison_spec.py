"""What a comparison keeps (``Comparison.spec``): its request and each method's verdict,
validated as its row is loaded (``service.json_column``). ``MethodVerdict`` is also the
start of what the API shows of a method (``app.comparison_schemas.MethodOutcome``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mebp_core.config import Method
from service.fleet_spec import Record

Verdict = Literal["runs", "does_not_fit", "no_device_estimate"]


class MethodVerdict(Record):
    method: Method
    verdict: Verdict = Field(description=(
        "runs; does_not_fit (predicted over the budget: no job); no_device_estimate "
        "(max_device_time_s cannot be turned into steps: no job)"))
    reason: str | None
    smallest_budget_mb: float | None
    steps: int | None = Field(description="steps each of its jobs trains")
    device_step_time_s_estimate: float | None
    predicted_peak_mb: float | None


class MethodRecord(MethodVerdict):
    """A method as the comparison planned it."""

    budget_mb: float


class StoredSharedHyperparameters(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    seq_len: int | None = None


class ComparisonRequest(BaseModel):
    """The comparison's request as it was made (``ComparisonCreate``, dumped): its fields
    read after the request are typed here, the others kept as they came."""

    model_config = ConfigDict(frozen=True, extra="allow")

    training_file: str
    validation_file: str
    max_steps: int | None = None
    max_device_time_s: float | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    hyperparameters: StoredSharedHyperparameters = StoredSharedHyperparameters()


class ComparisonSpec(Record):
    request: ComparisonRequest
    methods: list[MethodRecord] = Field(min_length=1)

    @property
    def budget_mb(self) -> float:
        """Every method's budget: the device's, or the request's override."""
        return self.methods[0].budget_mb
