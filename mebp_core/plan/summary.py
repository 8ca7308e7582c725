"""What a job records about its plan: the chosen configuration's predictions beside the
smallest budget that fits and the calibration they came from (``plan_summary`` makes it).

Rows written by older versions lack the keys added since (the method, who chose the
configuration, the modelled time, the calibration, ...): those default. A key it does not
know (a newer version's, read by an older process mid-upgrade) is ignored; a required key
missing (renamed, say) fails where the summary is read, naming the key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mebp_core.config import ComputeDtype, Method


def _unset(value: object) -> bool:
    return value is None


class Replanned(BaseModel):
    """An attempt's worker predicted the job's configuration not to fit its budget there
    and ran another: the one later attempts keep."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    reason: str
    previous_configuration: str
    worker: str
    attempt: int


class PlanSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    # always true: a job recorded before every method was planned said false (and little else)
    planned: Literal[True] = True
    method: Method = "mebp"  # before every method was planned, only mebp's jobs were
    configuration: str
    feasible: bool | None  # None: planned without a budget
    chosen_by: Literal["auto", "request"] = "auto"
    budget_mb: float | None
    margin: float
    matmul_dtype: ComputeDtype | None = None
    predicted_peak_mb: float
    predicted_memory_mb: dict[str, float]
    predicted_step_time_s: float
    # before this host's correction from measured runs (what the next run is compared to)
    modelled_step_time_s: float | None = None
    modelled_time_s: dict[str, float] | None = None
    time_correction: float | None = None
    device_step_time_s_estimate: float | None = None
    smallest_budget_mb: int
    smallest_configuration: str
    dominant_component: str
    calibration: dict[str, Any] | None = None  # HostCalibration.provenance()
    # present once a worker predicted it on its own host, or planned it again there
    predicted_by: str | None = Field(default=None, exclude_if=_unset)
    replanned: Replanned | None = Field(default=None, exclude_if=_unset)

    @property
    def calibrated_at(self) -> str | None:
        """When the calibration its predictions came from was measured."""
        return None if self.calibration is None else self.calibration.get("measured_at")

