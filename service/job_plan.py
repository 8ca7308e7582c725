"""A job's plan as its row keeps it (``Job.plan``): the planner's ``PlanSummary``, or, in rows
written before every method was planned, ``UnplannedJob``; validated as the row loads
(``service.json_column``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from mebp_core.plan.summary import PlanSummary


class UnplannedJob(BaseModel):
    """The plan of a job of another method than mebp recorded before every method was
    planned (older rows only: every job is planned now)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    planned: Literal[False]
    reason: str
    budget_mb: float | None = None
    device_step_time_s_estimate: float | None = None


JobPlan = Annotated[PlanSummary | UnplannedJob, Field(discriminator="planned")]
_JOB_PLAN = TypeAdapter(JobPlan)


def load_plan(value: object) -> PlanSummary | UnplannedJob | None:
    """``value`` (a plan, or its JSON) as a job's plan."""
    return None if value is None else _JOB_PLAN.validate_python(value)
