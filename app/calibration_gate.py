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
    HostCalibration,
    due_again_in,
    load_calibration,
)

log = logging.getLogger("mebp")
RETRY_AFTER_S = 10
FAILURE_RETRY_S = 60
# an unsteady calibration is measured again at most this many times (every RETRY_UNSTEADY_S):
# on a host its own jobs keep busy it may never be steady, and measuring beside them slows them
UNSTEADY_RETRIES = 6


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
        """The calibration on disk now, as a plan would read it (never measured here); None
        while there is none, or it cannot be read (the thread says why)."""
        try:
            return load_calibration(self.cache_dir, self.threads, measure=False)
        except Exception as exc:  # noqa: BLE001  health must answer whatever the file holds
            self.failure = self.failure or f"the cached calibration cannot be read: {exc}"
            return None

    def state(self) -> str:
        """``measuring`` (none usable yet), ``ready``, ``provisional`` (unsteady: plans say
        so) or ``failed`` (the last measurement failed, see ``failure``; tried again)."""
        calibration = self.current()
        if calibration is None:
            return "failed" if self.failure else "measuring"
        return "ready" if calibration.steady else "provisional"

    def unavailable_detail(self) -> str:
        if self.failure:
            return (f"this host's calibration failed, so nothing can be planned (measured "
                    f"again every {FAILURE_RETRY_S} s): {self.failure}")
        return (f"this host's calibration is being measured (the service is starting); "
                f"retry in {RETRY_AFTER_S} s, or watch /v1/health")

    def _run(self) -> None:
        started = time.monotonic()
        while (calibration := self._load()) is None:  # failed: tried again, never given up
            if self._stop.wait(FAILURE_RETRY_S):
                return
        print(f"mebp: ready: this host's calibration took {time.monotonic() - started:.0f} s"
              + ("" if calibration.steady else f"; it is unsteady (repeats spread "
                 f"{calibration.max_spread:.1f}x: a busy host), so plans are provisional "
                 "until it is measured again"), flush=True)
        for _ in range(UNSTEADY_RETRIES):  # a busy host: measured again when due, a while
            if calibration.steady or self._stop.wait(due_again_in(calibration) or 0.0):
                return
            calibration = self._load() or calibration

    def _load(self) -> HostCalibration | None:
        """Loaded, measured first where missing or due; None (and ``failure`` why) if not."""
        try:
            calibration = load_calibration(self.cache_dir, self.threads)
        except Exception as exc:  # noqa: BLE001  a full disk, a hung or failed measurement
            self.failure = str(exc)
            log.error("mebp: this host's calibration: %s", exc)
            return None
        self.failure = None
        return calibration
