"""How `mebp serve` stops on SIGTERM or SIGINT, within the 10 s systemd and `docker stop`
give before their SIGKILL.

At the signal: no child is restarted any more and each worker is asked to stop (its job
goes back to the queue from the engine's checkpoint, ``worker.stopping``). Meanwhile the API
stops accepting connections, ends its event streams (a client reconnects later with its
``Last-Event-ID``) and gives the requests in flight ``GRACEFUL_S``. Workers still running
``WORKERS_DEADLINE_S`` after the signal are killed; the embedded Redis stops last, once no
worker needs it. Then the process leaves without the interpreter's teardown, whose garbage
collection of the API's heap took 20-50 s on a busy 2-core host.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

import uvicorn

from service.queue import EmbeddedRedis
from service.supervisor import WorkerPool

GRACEFUL_S = 3.0
WORKERS_DEADLINE_S = 8.5


class ServiceStop:
    """The stop of the service's children: begun at the signal, finished as it exits."""

    def __init__(self) -> None:
        self.signalled_at: float | None = None
        self.signal_number = 0
        self.workers: WorkerPool | None = None
        self.redis: EmbeddedRedis | None = None

    def on_signal(self, number: int, frame: object) -> None:
        """SIGTERM's and SIGINT's handler outside uvicorn's: before it runs, the service
        leaves at once (through the caller's ``finally``); once it has handled one (which it
        raises again as it returns) or while the children stop, a signal changes nothing."""
        if self.signal_number:
            return
        self.signal_number = number
        raise SystemExit(128 + number)

    def begin(self, number: int = 0) -> None:
        """Quick and repeatable: a signal handler calls it."""
        self.signal_number = self.signal_number or number
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        if self.redis is not None:
            self.redis.stop_restarting()
        if self.workers is not None:
            self.workers.request_stop()

    def finish(self) -> None:
        self.begin()  # also when the server ended without a signal (it could not start)
        if self.workers is not None:
            self.workers.stop(deadline=self.signalled_at + WORKERS_DEADLINE_S)
        if self.redis is not None:
            self.redis.close()

    def exit(self, code: int) -> NoReturn:
        """Leave now, with ``code`` or the signal's (every child has exited and every write
        is committed: nothing is left for the interpreter's teardown to do)."""
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + self.signal_number if self.signal_number else code)


class StoppingServer(uvicorn.Server):
    """uvicorn's server, telling the service at the signal (``on_signal``) and ending the
    event streams (``end_streams``) before it waits for connections to close."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[int], None],
                 end_streams: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal, self._end_streams = on_signal, end_streams

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._on_signal(sig)

    async def shutdown(self, sockets=None) -> None:
        self._end_streams()
        await super().shutdown(sockets)
