"""Stopping a training run cleanly on SIGINT or SIGTERM (the run then saves what it has)."""

from __future__ import annotations

import signal
import threading


class StopOnSignals:
    """SIGINT and SIGTERM ask the run to stop after the current step (it then checkpoints)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_number = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopOnSignals:
        for number in (signal.SIGINT, signal.SIGTERM):
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, number: int, frame: object) -> None:
        if self._event.is_set():  # a second signal: stop now, the usual way
            self.__exit__()
            signal.raise_signal(number)
            return
        self.signal_number = number
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()
