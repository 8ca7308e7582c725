"""Process memory as the kernel counts it: what a memory cgroup charges and cannot reclaim,
anonymous plus shared memory (``RssAnon + RssShmem``), its sampled peak and the runtime
baseline. Clean file-backed pages (the memory-mapped store) are reclaimable and reported
apart (``RssFile``), as phones leave them out of an app's footprint."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

_STATUS = Path("/proc/self/status")
MB = 1 << 20
_FIELDS = {b"RssAnon:": "anon_bytes", b"RssShmem:": "shmem_bytes", b"RssFile:": "file_bytes"}


@dataclass(frozen=True)
class MemoryReading:
    anon_bytes: int
    shmem_bytes: int
    file_bytes: int  # clean file-backed pages: reclaimable, never part of the charged figure

    @property
    def charged_bytes(self) -> int:
        """What the kernel charges this process and cannot reclaim: anonymous + shared."""
        return self.anon_bytes + self.shmem_bytes


def read_memory() -> MemoryReading:
    values = {}
    for line in _STATUS.read_bytes().splitlines():
        name = _FIELDS.get(line[:line.find(b":") + 1])
        if name is not None:
            values[name] = int(line.split()[1]) * 1024
    if len(values) != len(_FIELDS):
        raise RuntimeError("/proc/self/status lacks RssAnon, RssShmem or RssFile")
    return MemoryReading(**values)


class MemorySampler:
    """Samples the process's memory on a background thread to catch peaks between steps.

    The baselines are taken at construction: build the sampler after the imports and before
    loading, so ``footprint`` means "memory the engine added above the runtime".
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        first = read_memory()
        self.baseline_bytes = first.charged_bytes
        self.baseline_anon_bytes = first.anon_bytes
        self.peak_bytes = self._step_peak_bytes = first.charged_bytes
        self.peak_anon_bytes = first.anon_bytes
        self.peak_file_bytes = first.file_bytes
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

    def sample(self) -> MemoryReading:
        current = read_memory()
        with self._lock:
            self.peak_bytes = max(self.peak_bytes, current.charged_bytes)
            self._step_peak_bytes = max(self._step_peak_bytes, current.charged_bytes)
            self.peak_anon_bytes = max(self.peak_anon_bytes, current.anon_bytes)
            self.peak_file_bytes = max(self.peak_file_bytes, current.file_bytes)
        return current

    def take_step_peak(self) -> int:
        """The charged peak since the previous call, then restart the per-step window."""
        current = self.sample().charged_bytes
        with self._lock:
            peak, self._step_peak_bytes = self._step_peak_bytes, current
        return peak

    @property
    def footprint_bytes(self) -> int:
        return self.peak_bytes - self.baseline_bytes

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
