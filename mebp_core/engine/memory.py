"""The peaks of the engine's memory as the kernel counts it (see ``mebp_core.kernel_memory``),
overall and per step, and the runtime baseline they are measured above: from a memory
cgroup's own counters where the process has one, else from a sampling thread."""

from __future__ import annotations

import threading

from mebp_core.kernel_memory import MemoryCgroup, MemoryReading, own_memory_cgroup, read_memory


class MemoryTracker:
    """The peaks of this process's charged memory, overall and per step, and its baseline.

    The baselines are taken at construction: build the tracker after the imports and before
    loading, so ``footprint`` means "memory the engine added above the runtime".
    ``method`` says where the figures come from.
    """

    method = ""
    usage_peak_bytes: int | None = None  # a cgroup's peak of usage (store pages included)

    def __init__(self, first: MemoryReading) -> None:
        self.baseline_bytes = self.peak_bytes = self._step_peak_bytes = first.charged_bytes
        self.baseline_anon_bytes = self.peak_anon_bytes = first.anon_bytes
        self.peak_file_bytes = first.file_bytes
        self._lock = threading.Lock()

    def __enter__(self) -> MemoryTracker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.take_step_peak()

    def take_step_peak(self) -> int:
        """The charged peak since the previous call, then restart the per-step window."""
        raise NotImplementedError

    @property
    def footprint_bytes(self) -> int:
        return self.peak_bytes - self.baseline_bytes

    def _record(self, charged: int, anon: int, file: int) -> None:
        with self._lock:
            self.peak_bytes = max(self.peak_bytes, charged)
            self._step_peak_bytes = max(self._step_peak_bytes, charged)
            self.peak_anon_bytes = max(self.peak_anon_bytes, anon)
            self.peak_file_bytes = max(self.peak_file_bytes, file)


class MemorySampler(MemoryTracker):
    """Samples ``/proc/self/status`` on a background thread to catch peaks between steps:
    for a process without a memory cgroup of its own. The thread takes the GIL every
    ``interval_s``."""

    def __init__(self, interval_s: float = 0.002) -> None:
        super().__init__(read_memory())
        self.interval_s = interval_s
        self.method = f"sampled every {interval_s * 1000:g} ms (RssAnon + RssShmem)"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
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
        self._record(current.charged_bytes, current.anon_bytes, current.file_bytes)
        return current

    def take_step_peak(self) -> int:
        current = self.sample().charged_bytes
        with self._lock:
            peak, self._step_peak_bytes = self._step_peak_bytes, current
        return peak

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


class CgroupCounters(MemoryTracker):
    """Peaks from the kernel's own counters of a memory cgroup this process is alone in: no
    thread. At each step's end it reads the cgroup's peak of usage since the step began and
    ``memory.stat``, then restarts the peak.

    Usage also counts what the kernel could reclaim (page cache, the mapped store's pages);
    that part is read at the step's end and taken off the peak, so the step's charged peak
    assumes the reclaimable part did not shrink during the step (it grows, if at all, as
    the store is first read), and is never below the charged figure at the step's end.
    """

    def __init__(self, group: MemoryCgroup) -> None:
        super().__init__(group.memory())
        self.group = group
        self.method = f"cgroup-v{group.version} counters ({group.path})"
        self.usage_peak_bytes = group.usage_bytes()

    def start(self) -> None:
        self.group.reset_peak()

    def stop(self) -> None:
        self.take_step_peak()
        self.group.close()

    def take_step_peak(self) -> int:
        usage_peak = self.group.peak_bytes()
        usage = self.group.usage_bytes()
        now = self.group.memory()
        reclaimable = max(usage - now.charged_bytes, 0)
        charged_peak = max(now.charged_bytes, usage_peak - reclaimable)
        anon_peak = max(now.anon_bytes, usage_peak - (usage - now.anon_bytes))
        self._record(charged_peak, anon_peak, now.file_bytes)
        self.usage_peak_bytes = max(self.usage_peak_bytes, usage_peak)
        self.group.reset_peak()
        return charged_peak


def track_memory(method: str = "auto") -> MemoryTracker:
    """The cgroup's counters where this process has a memory cgroup of its own whose peak
    the kernel can restart (``auto``, ``cgroup``), else the sampling thread (``thread``)."""
    if method not in ("auto", "cgroup", "thread"):
        raise ValueError(f"memory tracking method {method!r}: use auto, cgroup or thread")
    if method != "thread":
        group = own_memory_cgroup()
        if group is not None and group.reset_peak():
            return CgroupCounters(group)
        if method == "cgroup":
            raise RuntimeError("this process has no memory cgroup of its own whose peak the "
                               "kernel can restart")
    return MemorySampler()
