"""Server-Sent Events for a job: its events and per-step metrics as they reach the database.

Each message's id is ``<last event id>.<last metric id>``, so a client reconnecting with
``Last-Event-ID`` resumes where it left off; a value that is not two decimal numbers within
an id's range (huge, negative, not a number) starts over from the beginning. The stream
ends after the job's terminal event. A stream first catches up from its cursor page by page
(each page sent before the next is read, so a long history neither delays the first message
nor sits in memory), then follows the process's ``EventHub``; each key holds at most
``max_streams_per_key`` streams at once. A server stopping ends every stream (the hub's
``end_streams``) without an ``end`` message: the client reconnects with its cursor.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing

from fastapi import HTTPException, status
from fastapi.sse import KEEPALIVE_COMMENT, EventSourceResponse, format_sse_event
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from app.api.event_hub import Batch, EventHub, Subscription, read_batches
from app.api.request_sessions import SessionSlots

HEARTBEAT_S = 15.0
RETRY_AFTER_S = 10
# metrics (then events) per catch-up read; the first is small, so it comes at once
FIRST_PAGE_ROWS, PAGE_ROWS = 100, 500
MAX_ID = 2**31 - 1  # ids are INTEGER columns: 32 bits on PostgreSQL
_CURSOR = re.compile(r"([0-9]{1,10})\.([0-9]{1,10})")


def parse_cursor(last_event_id: str | None) -> tuple[int, int]:
    match = _CURSOR.fullmatch(last_event_id or "")
    if match is None or max(int(match[1]), int(match[2])) > MAX_ID:
        return 0, 0
    return int(match[1]), int(match[2])


class StreamSlots:
    """How many event streams each key holds open in this process (safe from any thread)."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def acquire(self, key: str) -> bool:
        with self._lock:
            if self._open[key] >= self.per_key:
                return False
            self._open[key] += 1
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]


class EventStreamResponse(EventSourceResponse):
    """Gives back its slot however it ends: the job ended, the client left, or an error.
    (FastAPI's own SSE routes are generators of events: this route answers a page of JSON
    or a stream by the ``Accept`` header, and refuses a stream over the key's bound with a
    429 before any of it is sent.)"""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})  # as FastAPI's
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def open_event_stream(state, job_id: str, key: str,
                      last_event_id: str | None) -> EventStreamResponse:
    """The stream, or a 429 when ``key`` holds as many as it may (``state``: the app's)."""
    slots: StreamSlots = state.stream_slots
    if not slots.acquire(key):
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"this key already has {slots.per_key} event streams open, the most it may "
            "(MEBP_MAX_STREAMS_PER_KEY); close one, or retry later",
            headers={"Retry-After": str(RETRY_AFTER_S)})
    return EventStreamResponse(
        stream_events(state.event_hub, state.session_slots, job_id, last_event_id),
        release=lambda: slots.release(key))


async def stream_events(hub: EventHub, slots: SessionSlots, job_id: str,
                        last_event_id: str | None) -> AsyncIterator[bytes]:
    """The job's messages from the client's cursor until its end."""
    cursor = _Cursor(*parse_cursor(last_event_id))
    with hub.subscribe(job_id) as subscription:
        async with aclosing(_batches(hub, subscription, slots, job_id, cursor)) as batches:
            async for batch in batches:
                if batch is None:
                    yield KEEPALIVE_COMMENT
                    continue
                page = b"".join(cursor.render(batch))  # one write, not hundreds
                if page:
                    yield page
                if batch.status is not None:
                    yield _message("end", json.dumps({"status": batch.status}), cursor.id)
                    return


async def _batches(hub: EventHub, subscription: Subscription, slots: SessionSlots,
                   job_id: str, cursor: _Cursor) -> AsyncIterator[Batch | None]:
    """The job's batches from ``cursor`` (None after a quiet heartbeat): pages of its own
    until one is not full, then the hub's; pages of its own again after it fell so far
    behind that the hub dropped some. Each page is read once the one before was sent."""
    caught_up, first = False, True
    while not subscription.ended:
        if not caught_up:
            batch = await _read_page(hub, slots, job_id, cursor, first)
            first = False
            if batch.complete:
                caught_up = True
                hub.follow(job_id, batch.cursors)
        else:
            batch = await subscription.next(HEARTBEAT_S)
            if subscription.ended:
                return
            if subscription.take_lag():
                caught_up = False
                continue
        yield batch


async def _read_page(hub: EventHub, slots: SessionSlots, job_id: str, cursor: _Cursor,
                     first: bool) -> Batch:
    async with hub.first_reads if first else hub.catch_up_reads, slots.hold():
        return (await run_in_threadpool(read_batches, slots.engine, {job_id: cursor.pair},
                                        FIRST_PAGE_ROWS if first else PAGE_ROWS))[job_id]


class _Cursor:
    """Where one stream is; rows it already sent (from its own read and the hub's) are
    dropped by id."""

    def __init__(self, event_id: int, metric_id: int) -> None:
        self.event_id, self.metric_id = event_id, metric_id

    @property
    def pair(self) -> tuple[int, int]:
        return self.event_id, self.metric_id

    @property
    def id(self) -> str:
        return f"{self.event_id}.{self.metric_id}"

    def render(self, batch: Batch) -> Iterator[bytes]:
        for message in batch.messages:
            if message.metric_id:
                if message.metric_id <= self.metric_id:
                    continue
                self.metric_id = message.metric_id
            elif message.event_id <= self.event_id:
                continue
            else:
                self.event_id = message.event_id
            yield _message(message.kind, message.data, self.id)


def _message(kind: str, data: str, cursor: str) -> bytes:
    # the id line first, as the stream always had it (FastAPI writes it last): a client that
    # reads line by line takes a message's id from the line before its data
    return f"id: {cursor}\n".encode() + format_sse_event(event=kind, data_str=data)
