"""A fleet's spec, its rounds' seats and a comparison's spec load as models: a row written by
older code (before federation, keys missing) loads with the defaults, a row written by newer
code (a key added) loads with that key ignored (a database shared mid rolling-upgrade), and a
row that does not validate (a required key renamed, a value of another kind) is an error
naming the row and the field as it is loaded, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from plan_rows import FIRST_ROW
from sqlalchemy import JSON, column, insert, table
from sqlmodel import Session

from mebp_core.plan.summary import PlanSummary
from service.db import make_engine
from service.json_column import MalformedRowError
from service.models import Comparison, Fleet, FleetRound

NOW = datetime(2026, 11, 30, tzinfo=UTC)
# the tables as plain JSON, so a test writes exactly the row it means
FLEETS = table("fleets", *map(column, ("id", "tenant", "model", "cancel_requested", "status",
                                       "error", "reserved_jobs", "prepare_retries",
                                       "created_at")), column("spec", JSON))
ROUNDS = table("fleet_rounds", *map(column, ("fleet_id", "index", "status", "started_at")),
               column("participants", JSON))
DEVICES = table("devices", column("id"), column("name"), column("builtin"),
                column("sources", JSON))
COMPARISONS = table("comparisons", *map(column, ("id", "tenant", "model", "device_id",
                                                 "created_at")), column("spec", JSON))
# a fleet as the first fleets (before federation) stored it: no round settings in its
# request, no examples nor job template in its members
PRE_FEDERATION_SPEC = {
    "request": {"model": "preset:tiny", "training_file": "ds-1", "validation_file": None,
                "devices": ["pixel-8"], "simulated": None, "memory_budget_mb": None,
                "hyperparameters": {"steps": 5, "seq_len": 32}, "config": "auto",
                "metadata": {"run": "old"}},
    "members": [{"device": "pixel-8", "shard": None, "training_file": "ds-1", "fits": True,
                 "plan": FIRST_ROW, "job_id": "job-1"}]}
SEAT = {"member": 0, "job_id": "job-2", "outcome": "trained", "examples": 10,
        "offline_after_step": None, "device_time_s": 2.5}
COMPARISON_SPEC = {
    "request": {"model": "preset:tiny", "training_file": "ds-1", "validation_file": "ds-2",
                "device": "pixel-8", "methods": ["mebp"], "max_steps": 4,
                "max_device_time_s": None, "hyperparameters": {"seq_len": 64},
                "metadata": {}},
    "methods": [{"method": "mebp", "verdict": "runs", "reason": None, "steps": 4,
                 "budget_mb": 1500.0, "smallest_budget_mb": 120, "predicted_peak_mb": 80.0,
                 "device_step_time_s_estimate": None}]}


@pytest.fixture
def engine(migrated_database_url):
    engine = make_engine(migrated_database_url)
    yield engine
    engine.dispose()


def write(engine, spec: dict, participants: list | None = None,
          comparison: dict | None = None) -> None:
    with engine.begin() as connection:
        connection.execute(insert(FLEETS).values(
            id="fleet-1", tenant="t", model="preset:tiny", cancel_requested=False,
            status="ready", error=None, reserved_jobs=0, prepare_retries=0, created_at=NOW,
            spec=spec))
        if participants is not None:
            connection.execute(insert(ROUNDS).values(
                fleet_id="fleet-1", index=2, status="done", started_at=NOW,
                participants=participants))
        if comparison is not None:
            connection.execute(insert(DEVICES).values(id="pixel-8", name="Pixel 8",
                                                      builtin=False, sources=[]))
            connection.execute(insert(COMPARISONS).values(
                id="cmp-1", tenant="t", model="preset:tiny", device_id="pixel-8",
                created_at=NOW, spec=comparison))


def test_rows_written_by_older_code_load_with_the_defaults(engine):
    write(engine, PRE_FEDERATION_SPEC, [SEAT], COMPARISON_SPEC)
    with Session(engine) as session:
        fleet = session.get(Fleet, "fleet-1")
        request, (member,) = fleet.spec.request, fleet.spec.members
        assert (request.aggregation, request.rounds, request.federated) == ("none", 1, False)
        assert request.steps_per_round == 5 and request.data_split is None
        assert request.metadata == {"run": "old"} and fleet.spec.references is None
        assert (member.device, member.job_id, member.examples, member.job) == \
            ("pixel-8", "job-1", None, None)
        seat, = session.get(FleetRound, ("fleet-1", 2)).participants
        assert (seat.outcome, seat.examples, seat.device_time_s) == ("trained", 10, 2.5)
        comparison = session.get(Comparison, "cmp-1").spec
        assert comparison.budget_mb == 1500.0 and comparison.methods[0].verdict == "runs"
        assert comparison.request.hyperparameters.seq_len == 64
        # written back unchanged: the request's keys the service does not read are kept
        fleet.spec = fleet.spec.model_copy(update={"references": []})
        session.add(fleet)
        session.commit()
    with Session(engine) as session:
        stored = session.get(Fleet, "fleet-1").spec
        assert stored.request.model_dump()["devices"] == ["pixel-8"]
        assert stored.references == []


def test_a_malformed_fleet_row_is_an_error_naming_the_fleet_and_the_field(engine):
    member = {**PRE_FEDERATION_SPEC["members"][0]}
    member["fit"] = member.pop("fits")  # a required key renamed by other code
    write(engine, {**PRE_FEDERATION_SPEC, "members": [member]})
    with Session(engine) as session, pytest.raises(MalformedRowError) as raised:
        session.get(Fleet, "fleet-1")
    assert "fleets row id='fleet-1'" in str(raised.value)
    assert "spec does not validate: members.0.fits: Field required" in str(raised.value)


def test_rows_written_by_newer_code_load_with_the_added_keys_ignored(engine):
    added = {"added_by_a_newer_version": 1}
    config = {"steps": 2, "seq_len": 32}
    member = {**PRE_FEDERATION_SPEC["members"][0], **added, "plan": {**FIRST_ROW, **added},
              "job": {"model": "preset:tiny", "device_id": None, "memory_budget_bytes": 1 << 30,
                      "plan": {**FIRST_ROW, **added}, "config": config, "training_file": "ds-1",
                      "validation_file": None, **added}}
    spec = {**PRE_FEDERATION_SPEC, **added, "members": [member],
            "references": [{"kind": "centralized", "member": None, "job_id": "job-3", **added}]}
    comparison = {**COMPARISON_SPEC, **added,
                  "methods": [{**COMPARISON_SPEC["methods"][0], **added}]}
    write(engine, spec, [{**SEAT, **added}], comparison)
    with Session(engine) as session:
        (loaded,) = session.get(Fleet, "fleet-1").spec.members
        assert loaded.plan == loaded.job.plan == PlanSummary.model_validate(FIRST_ROW)
        assert loaded.job.config.steps == 2 and loaded.fits
        assert "added_by_a_newer_version" not in loaded.model_dump()
        seat, = session.get(FleetRound, ("fleet-1", 2)).participants
        assert seat.outcome == "trained"
        assert session.get(Comparison, "cmp-1").spec.methods[0].verdict == "runs"


def test_a_malformed_round_is_an_error_naming_its_fleet_and_index(engine):
    write(engine, PRE_FEDERATION_SPEC, [{**SEAT, "outcome": "exploded"}])
    with Session(engine) as session, pytest.raises(MalformedRowError) as raised:
        session.get(FleetRound, ("fleet-1", 2))
    assert "fleet_rounds row fleet_id='fleet-1', index=2" in str(raised.value)
    assert "participants does not validate: 0.outcome" in str(raised.value)


def test_a_malformed_comparison_is_an_error_naming_it(engine):
    spec = {**COMPARISON_SPEC, "methods": [{**COMPARISON_SPEC["methods"][0], "steps": "x"}]}
    write(engine, PRE_FEDERATION_SPEC, comparison=spec)
    with Session(engine) as session, pytest.raises(MalformedRowError) as raised:
        session.get(Comparison, "cmp-1")
    assert "comparisons row id='cmp-1'" in str(raised.value)
    assert "methods.0.steps" in str(raised.value)
