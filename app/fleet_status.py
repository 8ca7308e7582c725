"""Where a fleet is in its life, the one definition the API and both fleet pages show.

The row stores only its preparation (``service.fleet_shards``: preparing, ready, failed,
cancelled before its jobs were made); once ready, the rest is read from its rounds and the
statuses of its jobs (members', rounds' and references'):

- running: a job of it has not ended, or a federated fleet has a round in progress or rounds
  still to start (and no cancel);
- cancelled: asked to cancel, nothing of it runs any more, and it stopped short: a federated
  fleet with fewer rounds than planned (the round in progress at the cancel ran to its end
  and its global adapter is kept), a fleet without rounds with a job cancelled;
- done: it ran all it planned and came to something: a round combined a global adapter, or
  (without rounds) a job succeeded;
- failed: its preparation failed, or it ran and came to nothing: every round failed (no
  device finished), or no job succeeded (each failed or was cancelled, or no device fit).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from service.crud import TERMINAL
from service.federation import DONE as ROUND_DONE
from service.federation import RUNNING as ROUND_RUNNING
from service.fleet_shards import CANCELLED, FAILED, PREPARING
from service.models import Fleet, FleetRound

FleetStatus = Literal["preparing", "running", "done", "cancelled", "failed"]
RUNNING, DONE = "running", "done"


def fleet_status(fleet: Fleet, rounds: list[FleetRound], job_statuses: Iterable[str]
                 ) -> FleetStatus:
    if fleet.status in (PREPARING, FAILED, CANCELLED):
        return fleet.status
    statuses = list(job_statuses)
    request = fleet.spec.request
    if request.federated:
        rounds_to_come = not fleet.cancel_requested and len(rounds) < request.rounds
        if rounds_to_come or any(r.status == ROUND_RUNNING for r in rounds):
            return RUNNING
    if any(status not in TERMINAL for status in statuses):
        return RUNNING
    if fleet.cancel_requested and (len(rounds) < request.rounds if request.federated
                                   else "cancelled" in statuses):
        return CANCELLED
    came_to_something = any(r.status == ROUND_DONE for r in rounds) if request.federated \
        else "succeeded" in statuses
    return DONE if came_to_something else FAILED
