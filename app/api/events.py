"""Server-Sent Events for a job: its events and per-step metrics as they reach the database.

Each message's id is ``<last event id>.<last metric id>``, so a client reconnecting with
``Last-Event-ID`` resumes where it left off. The stream ends after the job's terminal event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

from sqlalchemy import Engine
from sqlmodel import Session

from app.crud import TERMINAL, events_after, metrics_after
from app.models import Job

POLL_S = 0.25
HEARTBEAT_S = 15.0


def parse_cursor(last_event_id: str | None) -> tuple[int, int]:
    try:
        event, metric = (last_event_id or "0.0").split(".")
        return int(event), int(metric)
    except ValueError:
        return 0, 0


def stream_events(engine: Engine, job_id: str, last_event_id: str | None) -> Iterator[str]:
    event_cursor, metric_cursor = parse_cursor(last_event_id)
    quiet_since = time.monotonic()
    while True:
        with Session(engine) as session:
            job = session.get(Job, job_id)
            finished = job is None or job.status in TERMINAL
            messages = []  # (kind, data, cursor): each message's own resume point
            for metric in metrics_after(session, job_id, metric_cursor):
                metric_cursor = metric.id
                messages.append(("metric", {"step": metric.step, "loss": metric.loss,
                                            **metric.data, "at": metric.at.isoformat()},
                                 f"{event_cursor}.{metric_cursor}"))
            for event in events_after(session, job_id, event_cursor):
                event_cursor = event.id
                messages.append((event.kind, {"message": event.message, **event.data,
                                              "at": event.at.isoformat()},
                                 f"{event_cursor}.{metric_cursor}"))
        for kind, data, cursor in messages:
            yield _message(kind, data, cursor)
        if finished:  # read after the job's row: nothing written before the end is missed
            yield _message("end", {"status": None if job is None else job.status},
                           f"{event_cursor}.{metric_cursor}")
            return
        if messages:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > HEARTBEAT_S:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        time.sleep(POLL_S)


def _message(kind: str, data: dict, cursor: str) -> str:
    return f"id: {cursor}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
