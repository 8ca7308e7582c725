"""Preparations whose ask was lost: a fleet still ``preparing`` after the grace whose RQ job
no longer waits or runs (Redis restarted empty, its worker killed mid-split) is asked again,
up to ``max_attempts`` tries in all, then ends ``failed`` with the reason and its queue seats
given back. Asking again is safe: its shards' ids are fixed and their rows dealt the same
way, and a preparation re-checks the fleet's status under its row lock before it records
anything."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import update
from sqlmodel import Session, select

from service.fleet_shards import FAILED, PREPARING
from service.json_column import rows_that_load
from service.models import Fleet, utc_now
from service.queue import prepare_job_id


def lost_preparations(session: Session, asked: Callable[[str], bool], grace_s: float,
                      max_attempts: int) -> list[str]:
    """The fleets to ask again (their retry counted); those out of tries are failed.
    ``asked(rq_job_id)``: whether RQ still holds that job waiting or running."""
    cutoff = utc_now() - timedelta(seconds=grace_s)  # younger: its request is enqueueing it
    preparing = rows_that_load(session, select(Fleet).where(Fleet.status == PREPARING,
                                                            Fleet.created_at < cutoff))
    again = []
    for fleet in preparing:
        if asked(prepare_job_id(fleet.id)):
            continue
        tries = fleet.prepare_retries + 1
        if tries >= max_attempts:
            values = {"status": FAILED, "reserved_jobs": 0,
                      "error": f"its preparation was lost on each of its {tries} tries (its "
                               f"worker killed, or Redis emptied); make it again"}
        else:
            values = {"prepare_retries": tries}
        # only if no preparation ended it (nor another reconciler counted) since we looked
        moved = session.exec(update(Fleet).where(
            Fleet.id == fleet.id, Fleet.status == PREPARING,
            Fleet.prepare_retries == fleet.prepare_retries).values(**values))
        session.commit()
        if moved.rowcount == 1 and tries < max_attempts:
            again.append(fleet.id)
    return again
