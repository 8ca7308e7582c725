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

from sqlalchemy import Engine
from sqlmodel import Session

from app.db import POOL_CONNECTIONS

# the connections kept for the API's own background users: the event hub, the reconciler
# and the health check
RESERVED_CONNECTIONS = 3


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
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._slots = asyncio.Semaphore(POOL_CONNECTIONS - RESERVED_CONNECTIONS)

    async def session(self) -> AsyncIterator[Session]:
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        # a route may close it from a worker thread: release on the loop, where it belongs
        session = RequestSession(self.engine, lambda: loop.call_soon_threadsafe(
            self._slots.release))
        try:
            yield session
        finally:
            session.close()
