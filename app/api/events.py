"""Server-Sent Events for a job: its events and per-step metrics as they reach the database.

Each message's id is ``<last event id>.<last metric id>``, so a client reconnecting with
``Last-Event-ID`` resumes where it left off. The stream ends after the job's terminal event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from sqlalchemy import Engine
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

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


async def stream_events(engine: Engine, job_id: str,
                        last_event_id: str | None) -> AsyncIterator[str]:
    """Async, so an open stream holds no thread between polls; each poll's reads run in the
    thread pool."""
    cursors = parse_cursor(last_event_id)
    quiet_since = time.monotonic()
    while True:
        messages, cursors, status = await run_in_threadpool(_read_batch, engine, job_id,
                                                            *cursors)
        for kind, data, cursor in messages:
            yield _message(kind, data, cursor)
        if status is not None:  # read after the job's row: nothing written before the end
            yield _message("end", {"status": status}, f"{cursors[0]}.{cursors[1]}")
            return
        if messages:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > HEARTBEAT_S:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(POLL_S)


def _read_batch(engine: Engine, job_id: str, event_cursor: int,
                metric_cursor: int) -> tuple[list, tuple[int, int], str | None]:
    """New metrics and events, each message with its own resume point, and the job's
    terminal status if it has one."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        status = "gone" if job is None else job.status if job.status in TERMINAL else None
        messages = []
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
    return messages, (event_cursor, metric_cursor), status


def _message(kind: str, data: dict, cursor: str) -> str:
    return f"id: {cursor}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
