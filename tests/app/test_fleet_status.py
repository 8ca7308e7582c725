"""A fleet's status, from its row, its rounds and its jobs' statuses: every way a fleet can
stand, federated (three rounds planned) or without rounds."""

from __future__ import annotations

import pytest

from app.fleet_status import fleet_status
from service.fleet_spec import FleetRequest, FleetSpec
from service.models import Fleet, FleetRound


def fleet(*, rounds: int | None = None, stored: str = "ready",
          cancel_requested: bool = False) -> Fleet:
    federated = {} if rounds is None else {"aggregation": "fedavg", "rounds": rounds}
    request = FleetRequest(training_file="ds-1", hyperparameters={"steps": 2}, **federated)
    return Fleet(id="fleet-1", tenant="t", model="preset:tiny", status=stored,
                 cancel_requested=cancel_requested,
                 spec=FleetSpec(request=request, members=[]))


def rounds(*statuses: str) -> list[FleetRound]:
    return [FleetRound(fleet_id="fleet-1", index=index, status=status)
            for index, status in enumerate(statuses)]


@pytest.mark.parametrize(("stored", "expected"), [
    ("preparing", "preparing"), ("failed", "failed"), ("cancelled", "cancelled")])
def test_a_fleet_not_ready_reads_its_preparation(stored, expected):
    assert fleet_status(fleet(rounds=3, stored=stored), [], []) == expected


@pytest.mark.parametrize(("cancel", "round_statuses", "jobs", "expected"), [
    (False, ("running",), ["queued", "queued"], "running"),
    (False, ("done", "running"), ["succeeded", "running"], "running"),
    # between rounds (its coordinator lost): rounds to come
    (False, ("done",), ["succeeded"], "running"),
    # its rounds over, a reference still training
    (False, ("done", "done", "done"), ["succeeded", "running"], "running"),
    (False, ("done", "failed", "done"), ["succeeded", "failed", "succeeded"], "done"),
    (False, ("failed", "failed", "failed"), ["failed", "cancelled", "failed"], "failed"),
    # cancelled in round 0: its jobs run to their end, then it reads cancelled
    (True, ("running",), ["running"], "running"),
    (True, ("done",), ["succeeded"], "cancelled"),
    (True, ("failed",), ["failed"], "cancelled"),
    # cancelled in its last round: it ran all it planned
    (True, ("done", "done", "done"), ["succeeded", "cancelled"], "done"),
])
def test_a_federated_fleet(cancel, round_statuses, jobs, expected):
    assert fleet_status(fleet(rounds=3, cancel_requested=cancel), rounds(*round_statuses),
                        jobs) == expected


@pytest.mark.parametrize(("cancel", "jobs", "expected"), [
    (False, ["queued", "running"], "running"),
    (False, ["succeeded", "failed"], "done"),
    (False, ["failed", "failed"], "failed"),
    (False, [], "failed"),  # no device fit: no job
    (True, ["cancelled", "running"], "running"),
    (True, ["succeeded", "cancelled"], "cancelled"),
    (True, ["succeeded", "succeeded"], "done"),  # cancelled once all had ended
])
def test_a_fleet_without_rounds(cancel, jobs, expected):
    assert fleet_status(fleet(cancel_requested=cancel), [], jobs) == expected
