"""Database sessions for requests, never more at once than the pool has connections.

Sync routes and dependencies run on a pool of 40 threads, and a request keeps its session's
connection between them (and while FastAPI validates a sync route's response on yet another
thread). With more requests than connections in flight, every thread could end up waiting
for a connection held by a request that waits for a thread: a deadlock until the pool's
timeout, then 500s. So a request takes a slot before its session and gives it back when the
session closes; a request without a slot waits on the event loop, holding nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from sqlalchemy import Engine
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from service.db import POOL_CONNECTIONS

# the connections kept for the API's background threads: the event hub and the reconciler
RESERVED_CONNECTIONS = 2


class RequestSession(Session):
    """A session that gives its slot back the first time it is closed (a route that ends
    its database work early, such as an event stream, frees the slot for the stream's
    whole life)."""

    def __init__(self, engine: Engine, on_close: Callable[[], None]) -> None:
        super().__init__(engine)
        self._on_close: Callable[[], None] | None = on_close

    def close(self) -> None:
        super().close()
        release, self._on_close = self._on_close, None
        if release is not None:
            release()


class SessionSlots:
    """Every database use on a request's path takes a slot: a request's session for its
    life (``session``), or a short read of its own (``hold``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._slots = asyncio.Semaphore(POOL_CONNECTIONS - RESERVED_CONNECTIONS)

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self._slots:
            yield

    async def session(self) -> AsyncIterator[Session]:
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        # a route may close it from a worker thread: release on the loop, where it belongs
        session = RequestSession(self.engine, lambda: loop.call_soon_threadsafe(
            self._slots.release))
        try:
            yield session
        finally:
            # on a thread: a rollback waiting on a stalled database must not stall the loop
            await run_in_threadpool(session.close)
