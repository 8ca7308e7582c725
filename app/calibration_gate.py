"""This host's calibration, made ready when the service starts and never on a request.

The gate measures (or loads, or waits for another process on this host measuring) the
calibration the API plans with, in a thread started with the app; until it is on disk the
service is ``starting`` (``/v1/health`` is a 503 saying ``"calibration": "measuring"``) and a
request that needs a plan is a 503 with ``Retry-After``, answered at once. An unsteady
calibration (a busy host) is used, its plans marked provisional, and measured again in the
background when due; a steadier one replaces it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from mebp_core.plan.calibration import (
    CalibrationError,
    HostCalibration,
    due_again_in,
    load_calibration,
)

log = logging.getLogger("mebp")
RETRY_AFTER_S = 10


class CalibrationGate:
    def __init__(self, cache_dir: Path, threads: int | None) -> None:
        self.cache_dir, self.threads = cache_dir, threads
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mebp-calibration", daemon=True)

    def start(self) -> CalibrationGate:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()  # a measurement under way finishes in its own child process

    def current(self) -> HostCalibration | None:
        """The calibration on disk now, as a plan would read it (never measured here)."""
        try:
            return load_calibration(self.cache_dir, self.threads, measure=False)
        except CalibrationError:  # unreadable: the thread reports why
            return None

    def state(self) -> str:
        """``measuring`` (none usable yet), ``ready``, ``provisional`` (unsteady: plans say
        so) or ``failed`` (the measurement failed: see ``failure``)."""
        calibration = self.current()
        if calibration is None:
            return "failed" if self.failure else "measuring"
        return "ready" if calibration.steady else "provisional"

    def unavailable_detail(self) -> str:
        if self.failure:
            return f"this host's calibration failed, so nothing can be planned: {self.failure}"
        return (f"this host's calibration is being measured (the service is starting); "
                f"retry in {RETRY_AFTER_S} s, or watch /v1/health")

    def _run(self) -> None:
        started = time.monotonic()
        try:
            calibration = load_calibration(self.cache_dir, self.threads)
        except CalibrationError as exc:
            self.failure = str(exc)
            log.error("mebp: %s", exc)
            return
        print(f"mebp: ready: this host's calibration took {time.monotonic() - started:.0f} s"
              + ("" if calibration.steady else f"; it is unsteady (repeats spread "
                 f"{calibration.max_spread:.1f}x: a busy host), so plans are provisional "
                 "until it is measured again"), flush=True)
        while not calibration.steady:  # a busy host: measured again when due
            if self._stop.wait(due_again_in(calibration) or 0.0):
                return
            try:
                calibration = load_calibration(self.cache_dir, self.threads)
            except CalibrationError as exc:
                log.warning("mebp: measuring this host's calibration again failed: %s", exc)
                return
