"""One poller per API process for every open event stream.

Each poll reads, in one short session, the new events and metrics of every job that has a
stream open, and hands each job's batch to the asyncio queue of each of its streams: a stream
holds no database connection and no thread while it waits. A new stream catches up with reads
of its own (``read_batches``), then follows the hub.

Every read is a page: at most ``limit_rows`` metrics, then (only once the metrics are all
read) at most ``limit_rows`` events, for all the jobs of a statement together, in id order.
A job with a long history is read page by page, never whole, and its end is reported only
with its last page.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from sqlalchemy import Engine, and_, or_
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from service.crud import TERMINAL
from service.models import Event, Job, Metric

log = logging.getLogger("mebp.events")
POLL_S = 0.25
JOBS_PER_QUERY = 100  # per-job conditions OR-ed in one statement, well inside SQLite's depth
QUEUE_BATCHES = 256  # a stream this far behind (a stalled client) re-reads on its own
POLL_ROWS = 1000  # metrics (and events) one poll reads per statement; more wait for the next
# streams' catch-up reads at once, in two lanes (a stream's first page never waits behind
# other streams' later pages): a burst of streams on long histories leaves the other
# request slots (health, the API) free
FIRST_READS, CATCH_UP_READS = 2, 3


@dataclass(frozen=True, slots=True)
class Message:
    kind: str
    data: str  # as JSON: rendered where it is read, off the event loop
    event_id: int = 0  # the event row's id (0 for a metric)
    metric_id: int = 0  # the metric row's id (0 for an event)


@dataclass(frozen=True)
class Batch:
    """A job's rows after a cursor, and its terminal status ("gone" if deleted), read first
    so that every row written before the end is in the batch that reports it."""

    messages: list[Message]
    cursors: tuple[int, int]  # the last event and metric id read
    status: str | None  # only in a complete batch
    complete: bool = True  # False: a page was full, more rows may follow at once


def read_batches(engine: Engine, cursors: dict[str, tuple[int, int]],
                 limit_rows: int = POLL_ROWS) -> dict[str, Batch]:
    """Each job's rows after its (event, metric) cursor, a page of at most ``limit_rows``
    metrics and as many events per statement, a few statements for all of them."""
    job_ids = list(cursors)
    batches: dict[str, Batch] = {}
    with Session(engine) as session:
        for start in range(0, len(job_ids), JOBS_PER_QUERY):
            chunk = {job_id: cursors[job_id] for job_id in job_ids[start:start + JOBS_PER_QUERY]}
            batches.update(_read_chunk(session, chunk, limit_rows))
    return batches


def _read_chunk(session: Session, cursors: dict[str, tuple[int, int]],
                limit_rows: int) -> dict[str, Batch]:
    statuses = dict(session.exec(select(Job.id, Job.status)
                                 .where(col(Job.id).in_(list(cursors)))).all())
    # columns, not entities: a third of the time per page
    metrics = session.exec(select(
        Metric.id, Metric.job_id, Metric.step, Metric.loss, Metric.data, Metric.at)
        .where(or_(*(and_(Metric.job_id == job_id, col(Metric.id) > metric)
                     for job_id, (_, metric) in cursors.items())))
        .order_by(col(Metric.id)).limit(limit_rows)).all()
    # the events once every metric is read: a history replays its metrics, then its events
    complete = len(metrics) < limit_rows
    events = session.exec(select(
        Event.id, Event.job_id, Event.kind, Event.message, Event.data, Event.at)
        .where(or_(*(and_(Event.job_id == job_id, col(Event.id) > event)
                     for job_id, (event, _) in cursors.items())))
        .order_by(col(Event.id)).limit(limit_rows)).all() if complete else []
    complete = complete and len(events) < limit_rows
    messages: dict[str, list[Message]] = {job_id: [] for job_id in cursors}
    last = {job_id: list(cursor) for job_id, cursor in cursors.items()}
    for metric in metrics:  # metrics first, then events: the order the stream always had
        messages[metric.job_id].append(Message("metric", json.dumps({
            "step": metric.step, "loss": metric.loss, **metric.data,
            "at": metric.at.isoformat()}), metric_id=metric.id))
        last[metric.job_id][1] = metric.id
    for event in events:
        messages[event.job_id].append(Message(event.kind, json.dumps({
            "message": event.message, **event.data, "at": event.at.isoformat()}),
            event_id=event.id))
        last[event.job_id][0] = event.id
    return {job_id: Batch(messages[job_id], (last[job_id][0], last[job_id][1]),
                          _terminal(statuses.get(job_id, "gone")) if complete else None,
                          complete)
            for job_id in cursors}


def _terminal(status: str) -> str | None:
    return status if status == "gone" or status in TERMINAL else None


class Subscription:
    """One stream's queue of its job's batches, until the hub ends it (``ended``)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Batch | None] = asyncio.Queue(QUEUE_BATCHES)
        self._lagged = False
        self.ended = False

    def end(self) -> None:
        self.ended = True
        with suppress(asyncio.QueueFull):  # full: ``next`` does not wait anyway
            self._queue.put_nowait(None)  # wakes ``next``

    def offer(self, batch: Batch) -> None:
        try:
            self._queue.put_nowait(batch)
        except asyncio.QueueFull:
            self._lagged = True

    def take_lag(self) -> bool:
        """True once after batches were dropped: the stream must read them itself; what is
        queued is dropped too (that read covers it)."""
        if not self._lagged:
            return False
        self._lagged = False
        while not self._queue.empty():
            self._queue.get_nowait()
        return True

    async def next(self, timeout_s: float) -> Batch | None:
        """The next batch, or None after ``timeout_s`` of quiet or once ended."""
        try:
            return await asyncio.wait_for(self._queue.get(), timeout_s)
        except TimeoutError:
            return None


class EventHub:
    """Started in the app's lifespan; its state is touched only from the event loop."""

    def __init__(self, engine: Engine, poll_s: float = POLL_S) -> None:
        self.engine, self.poll_s = engine, poll_s
        self._streams: dict[str, set[Subscription]] = {}
        self._cursors: dict[str, tuple[int, int]] = {}  # per followed job: what was read
        self._task: asyncio.Task | None = None
        self.first_reads = asyncio.Semaphore(FIRST_READS)
        self.catch_up_reads = asyncio.Semaphore(CATCH_UP_READS)
        self._ending = False  # the server is stopping: every stream ends, new ones at once

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="mebp-event-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @contextmanager
    def subscribe(self, job_id: str) -> Iterator[Subscription]:
        """Subscribe before the stream's own catch-up read, so nothing falls between the two
        (what both see, the stream drops by id)."""
        self.start()  # a no-op once the lifespan has
        subscription = Subscription()
        if self._ending:
            subscription.end()
        self._streams.setdefault(job_id, set()).add(subscription)
        try:
            yield subscription
        finally:
            streams = self._streams.get(job_id, set())
            streams.discard(subscription)
            if not streams:
                self._streams.pop(job_id, None)
                self._cursors.pop(job_id, None)

    def end_streams(self) -> None:
        """End every stream, and any opened from now on: the server is stopping (its
        clients reconnect, to another process or once it is back, with their
        ``Last-Event-ID``). Called on the event loop."""
        self._ending = True
        for subscriptions in self._streams.values():
            for subscription in subscriptions:
                subscription.end()

    def follow(self, job_id: str, cursors: tuple[int, int]) -> None:
        """Poll ``job_id`` from ``cursors`` (where a stream's catch-up ended) or from where
        the hub is, whichever is earlier: one client's cursor never hides rows from another."""
        if job_id not in self._streams:
            return
        known = self._cursors.get(job_id, cursors)
        self._cursors[job_id] = (min(known[0], cursors[0]), min(known[1], cursors[1]))

    async def _run(self) -> None:
        behind = False  # the last poll read a full page: read on without waiting
        while True:
            await asyncio.sleep(0 if behind else self.poll_s)
            behind = False
            if not self._cursors:
                continue
            read_from = dict(self._cursors)
            try:
                batches = await asyncio.to_thread(read_batches, self.engine, read_from)
            except SQLAlchemyError as exc:  # the database is down: the streams wait
                log.warning("event hub: %s", exc)
                await asyncio.sleep(1.0)
                continue
            except Exception:  # a bug must not end every stream of the process with it
                log.exception("event hub: poll failed")
                await asyncio.sleep(1.0)
                continue
            self._deliver(read_from, batches)
            behind = not all(batch.complete for batch in batches.values())

    def _deliver(self, read_from: dict[str, tuple[int, int]],
                 batches: dict[str, Batch]) -> None:
        for job_id, batch in batches.items():
            now = self._cursors.get(job_id)
            if now is None:  # its last stream went while we read
                continue
            if batch.status is not None:  # every stream ends on it; a new one re-follows
                del self._cursors[job_id]
            elif now == read_from[job_id]:
                self._cursors[job_id] = batch.cursors
            else:  # a stream followed from earlier while we read: keep that
                self._cursors[job_id] = (min(now[0], batch.cursors[0]),
                                         min(now[1], batch.cursors[1]))
            if batch.messages or batch.status is not None:
                for subscription in self._streams.get(job_id, ()):
                    subscription.offer(batch)
