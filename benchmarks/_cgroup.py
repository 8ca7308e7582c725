"""A throwaway memory cgroup to run one benchmark child under a cap: the service's own job
caps (``worker.memory_cap``: v2 where usable, else v1, no swap), read through the one
definition of memory (``mebp_core.kernel_memory``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from mebp_core.kernel_memory import MemoryCgroup, stat_counters
from mebp_core.units import MB
from worker.memory_cap import PROCS_ENV, CgroupV1Cap, CgroupV2Cap, open_memory_cap


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be made on this machine."""


class BenchCgroup:
    """One cap, the peaks of what its child is charged, sampled while it runs."""

    def __init__(self, cap: CgroupV1Cap | CgroupV2Cap) -> None:
        self.cap = cap
        self.version = 2 if isinstance(cap, CgroupV2Cap) else 1
        self.counters = MemoryCgroup(cap.path, self.version)
        self.samples = {"peak_charged": 0, "peak_file": 0}

    def wrap(self, argv: list[str]) -> list[str]:
        """A command that joins this cgroup, then execs ``argv`` (same pid: all of it counts)."""
        procs = shlex.quote(self.cap.child_env()[PROCS_ENV])
        return ["/bin/sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def sample(self) -> None:
        """Track the peak charge the kernel cannot reclaim (anonymous + shared memory) and
        the file cache beside it, while the child runs."""
        try:
            memory = self.counters.memory()
        except OSError:
            return  # the group is being removed
        self.samples["peak_charged"] = max(self.samples["peak_charged"], memory.charged_bytes)
        self.samples["peak_file"] = max(self.samples["peak_file"], memory.file_bytes)

    def stats(self) -> dict:
        peak = self.cap.peak_bytes()
        return {"version": self.version, "cap_mb": self.cap.limit_bytes / MB,
                "sampled_peak_charged_mb": self.samples["peak_charged"] / MB,
                "sampled_peak_file_mb": self.samples["peak_file"] / MB,
                # the engine restarts this counter every step: its last step's, at the least
                "max_usage_mb": None if peak is None else peak / MB,
                "failcnt": self.cap.limit_hits(), "oom_kill": int(self.cap.oom_killed()),
                **self.paging()}

    def paging(self) -> dict:
        """How often the group read file pages back in: its major faults, and its refaults
        of file pages it had itself dropped under the cap (pages it reads again, not its
        first reads), from ``memory.stat`` (v1 and v2 both have them)."""
        try:
            stat = stat_counters(self.counters.stat_text())
        except OSError:
            return {}
        return {"major_faults": stat.get("pgmajfault", 0),
                "file_refaults": stat.get("workingset_refault_file",
                                          stat.get("workingset_refault"))}

    def remove(self) -> None:
        self.cap.close()


def create_cgroup(cap_bytes: int, name: str) -> BenchCgroup:
    cap, warning = open_memory_cap("auto", name, cap_bytes)
    if isinstance(cap, CgroupV1Cap | CgroupV2Cap):
        return BenchCgroup(cap)
    cap.close()
    raise CgroupUnavailable(warning or "no memory cgroup could be made")


def evict_page_cache(directory: Path) -> None:
    """Drop the cached pages of every file in ``directory`` (none may be mapped or dirty
    elsewhere), so a capped child faults the files in itself and is charged for them: the
    kernel charges a cached page to the cgroup that first read it, not to a later reader."""
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


SAMPLE_INTERVAL_S = 0.01


def run_in_cgroup(argv: list[str], cap_bytes: int, name: str, env: dict[str, str]
                  ) -> tuple[int, str, dict]:
    """Run ``argv`` in a fresh cgroup capped at ``cap_bytes``, sampling its charge every
    10 ms: its exit code, its stderr and the cgroup's ``stats``."""
    group = create_cgroup(cap_bytes, name)
    try:
        # stderr to a file, not a pipe: nothing reads a pipe while the child runs
        with tempfile.TemporaryFile("w+") as stderr:
            child = subprocess.Popen(group.wrap(argv), stdout=subprocess.DEVNULL,
                                     stderr=stderr, env=env)
            while child.poll() is None:
                group.sample()
                time.sleep(SAMPLE_INTERVAL_S)
            stderr.seek(0)
            return child.returncode, stderr.read(), group.stats()
    finally:
        group.remove()
