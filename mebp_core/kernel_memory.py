"""Memory as the kernel counts it, the one definition every figure uses: what a memory cgroup
charges and cannot reclaim, anonymous plus shared memory. For a process that is
``RssAnon + RssShmem`` (``/proc/self/status``); for a cgroup, v2 or v1, it comes from
``memory.stat``. Clean file-backed pages (the memory-mapped store) are reclaimable and
reported apart, as phones leave them out of an app's footprint.

A cgroup's usage, and its resettable peak of usage, count reclaimable page cache too: an
upper bound of the charged figure, never the figure itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_STATUS = Path("/proc/self/status")
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


def stat_counters(text: str) -> dict[str, int]:
    """``memory.stat``'s counters by name."""
    stat = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            stat[parts[0]] = int(parts[1])
    return stat


def parse_memory_stat(text: str) -> MemoryReading:
    """v2 names anonymous memory ``anon`` and page cache ``file``; v1 ``rss`` and ``cache``.
    Both count shmem inside the page cache, and v1's ``rss`` holds transparent huge pages
    (its ``rss_huge`` is a part of it, not an addition)."""
    stat = stat_counters(text)
    shmem = stat.get("shmem", 0)
    if "anon" in stat:
        return MemoryReading(stat["anon"], shmem, stat.get("file", 0) - shmem)
    return MemoryReading(stat.get("rss", 0), shmem, stat.get("cache", 0) - shmem)


class MemoryCgroup:
    """A memory cgroup's counters, read by path (``version`` 2 or 1)."""

    def __init__(self, path: Path, version: int) -> None:
        self.path, self.version = path, version
        self._usage = path / ("memory.current" if version == 2 else "memory.usage_in_bytes")
        self._peak_fd: int | None = None

    def memory(self) -> MemoryReading:
        return parse_memory_stat(self.stat_text())

    def stat_text(self) -> str:
        return (self.path / "memory.stat").read_text()

    def usage_bytes(self) -> int:
        return int(self._usage.read_text())

    def limit_bytes(self) -> int | None:
        """The group's hard limit, or None when it has none."""
        if self.version == 2:
            text = (self.path / "memory.max").read_text().strip()
            return None if text == "max" else int(text)
        limit = int((self.path / "memory.limit_in_bytes").read_text())
        return None if limit >= 1 << 62 else limit  # v1 writes "unlimited" as ~2^63

    def procs(self) -> list[int]:
        return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]

    def reset_peak(self) -> bool:
        """Restart the peak of usage at the current usage; False where the kernel cannot
        (cgroup v2 before Linux 6.12)."""
        try:
            if self.version == 1:
                (self.path / "memory.max_usage_in_bytes").write_text("0")
                return True
            if self._peak_fd is None:  # v2 resets per open file: keep one open
                self._peak_fd = os.open(self.path / "memory.peak", os.O_RDWR)
            os.write(self._peak_fd, b"reset\n")
            return True
        except OSError:
            return False

    def peak_bytes(self) -> int:
        """The peak of usage since the last :meth:`reset_peak`."""
        if self.version == 1:
            return int((self.path / "memory.max_usage_in_bytes").read_text())
        return int(os.pread(self._peak_fd, 64, 0))

    def close(self) -> None:
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None


def memory_cgroup_of(pid: int | str = "self", root: Path = CGROUP_ROOT) -> MemoryCgroup | None:
    """The memory cgroup a process is in: the v2 one where its hierarchy has the memory
    controller, else the v1 one; None when neither is mounted or it is the root group."""
    v1 = v2 = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if path.strip("/") == "":
            continue  # the root group: every process on the machine
        if hierarchy == "0" and controllers == "":
            v2 = path.strip("/")
        elif "memory" in controllers.split(","):
            v1 = path.strip("/")
    candidates = []
    if v2 is not None:
        candidates += [(root / v2, 2), (root / "unified" / v2, 2)]
    if v1 is not None:
        candidates.append((root / "memory" / v1, 1))
    for path, version in candidates:
        if (path / ("memory.current" if version == 2 else "memory.usage_in_bytes")).is_file():
            return MemoryCgroup(path, version)
    return None


def own_memory_cgroup(root: Path = CGROUP_ROOT) -> MemoryCgroup | None:
    """This process's memory cgroup when it holds nothing but this process and its children
    (a job's cap, a benchmark's throwaway group), so that its counters are this run's memory."""
    group = memory_cgroup_of("self", root)
    try:
        if group is not None and all(_descends_from_self(pid) for pid in group.procs()):
            return group
    except OSError:
        pass
    return None


def _descends_from_self(pid: int) -> bool:
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat[stat.rindex(")") + 2:].split()[1])  # the parent, after the state
    return False
