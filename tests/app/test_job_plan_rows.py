"""A job's plan is stored as JSON and read back as the planner's ``PlanSummary``: rows of
older versions load (later keys defaulted; a job recorded unplanned as it was), the API shows
the plan as it was stored, and a row of an unknown shape is an error naming the job. On
SQLite and on the machine's real PostgreSQL."""

from __future__ import annotations

import json

import pytest
from plan_rows import FIRST_ROW
from sqlalchemy import text
from sqlmodel import Session

from app.job_view import job_public
from mebp_core.config import TrainConfig
from mebp_core.plan.summary import PlanSummary
from service.db import make_engine
from service.job_plan import UnplannedJob
from service.json_column import MalformedRowError
from service.models import Dataset, Job

UNPLANNED_ROW = {"planned": False, "budget_mb": 400.0, "device_step_time_s_estimate": 2.5,
                 "reason": "the planner models method mebp, not mezo"}


@pytest.fixture
def engine(migrated_database_url):
    engine = make_engine(migrated_database_url)
    with Session(engine) as session:
        session.add(Dataset(id="d1", tenant="t", filename="d.jsonl", path="/dev/null",
                            bytes=0, rows=1, sha256="0" * 64))
        session.add(Job(id="j1", tenant="t", status="queued", model="preset:tiny",
                        config=TrainConfig().model_dump(mode="json"), training_file="d1"))
        session.commit()
    yield engine
    engine.dispose()


def stored(engine, plan_json: str) -> Job:
    """Job j1 with ``plan_json`` written as an older version (or a hand) wrote it."""
    with Session(engine) as session:
        session.connection().execute(text("update jobs set plan = :plan where id = 'j1'"),
                                     {"plan": plan_json})
        session.commit()
    with Session(engine) as session:
        return session.get(Job, "j1")


def test_a_row_written_before_the_later_keys_loads_with_their_defaults(engine):
    job = stored(engine, json.dumps(FIRST_ROW))
    assert isinstance(job.plan, PlanSummary) and job.planned() is job.plan
    assert job.plan.configuration == "lazy-tile8M" and job.plan.chosen_by == "auto"
    assert job.plan.modelled_step_time_s is None and job.plan.replanned is None
    shown = job_public(job, None).model_dump(mode="json")
    assert shown["plan"] == PlanSummary.model_validate(FIRST_ROW).model_dump(mode="json")
    assert shown["progress"]["predicted_peak_mb"] == 250.5


def test_a_row_written_by_a_newer_version_loads_with_the_added_key_ignored(engine):
    job = stored(engine, json.dumps({**FIRST_ROW, "added_by_a_newer_version": [1, 2]}))
    assert job.plan == PlanSummary.model_validate(FIRST_ROW)


def test_a_job_recorded_unplanned_loads_and_shows_as_it_was_stored(engine):
    job = stored(engine, json.dumps(UNPLANNED_ROW))
    assert job.plan == UnplannedJob(**UNPLANNED_ROW) and job.planned() is None
    shown = job_public(job, None).model_dump(mode="json")
    assert shown["plan"] == UNPLANNED_ROW and shown["progress"]["predicted_peak_mb"] is None


def test_a_plan_written_back_keeps_what_it_holds(engine):
    job = stored(engine, json.dumps(FIRST_ROW))
    with Session(engine) as session:
        job = session.get(Job, "j1")
        job.plan = job.plan.model_copy(update={"predicted_by": "w1"})
        session.add(job)
        session.commit()
        raw = session.connection().execute(text("select plan from jobs where id = 'j1'"))
        row = raw.scalar_one()
    row = json.loads(row) if isinstance(row, str) else row
    assert row == {**PlanSummary.model_validate(FIRST_ROW).model_dump(mode="json"),
                   "predicted_by": "w1"}


@pytest.mark.parametrize("plan_json, names", [
    # a required key renamed: the one missing is named
    ('{"planned": true, "configurashun": "lazy-tile8M"}', "configuration: Field required"),
    ('{"planned": "maybe"}', "planned"),
    ('[1, 2]', "(the value)"),
])
def test_a_row_of_an_unknown_shape_is_an_error_naming_the_job(engine, plan_json, names):
    with pytest.raises(MalformedRowError, match=r"jobs row id='j1': its stored plan") as raised:
        stored(engine, plan_json)
    assert names in str(raised.value)
