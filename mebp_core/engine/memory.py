"""Process memory accounting: anonymous resident memory, its sampled peak, the runtime baseline."""

from __future__ import annotations

import threading
from pathlib import Path

_STATUS = Path("/proc/self/status")
MB = 1 << 20


def read_anon_rss_bytes() -> int:
    """The process's anonymous resident memory (heap, tensors), excluding mapped files."""
    for line in _STATUS.read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no RssAnon line")


class MemorySampler:
    """Samples RssAnon on a background thread to catch peaks between steps.

    ``baseline_anon_bytes`` is taken at construction: build the sampler after the imports and
    before loading, so ``footprint`` means "memory the engine added above the runtime".
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.baseline_anon_bytes = read_anon_rss_bytes()
        self.peak_anon_bytes = self.baseline_anon_bytes
        self._step_peak_bytes = self.baseline_anon_bytes
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mebp-mem", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()

    def sample(self) -> int:
        current = read_anon_rss_bytes()
        with self._lock:
            self.peak_anon_bytes = max(self.peak_anon_bytes, current)
            self._step_peak_bytes = max(self._step_peak_bytes, current)
        return current

    def take_step_peak(self) -> int:
        """The peak since the previous call, then restart the per-step window."""
        current = self.sample()
        with self._lock:
            peak, self._step_peak_bytes = self._step_peak_bytes, current
        return peak

    @property
    def footprint_bytes(self) -> int:
        return self.peak_anon_bytes - self.baseline_anon_bytes

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

