"""A throwaway memory cgroup (v2 or v1, detected at runtime) to run one child under a cap."""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from mebp_core.kernel_memory import parse_memory_stat
from mebp_core.units import MB

CGROUP_ROOT = Path("/sys/fs/cgroup")
V2_ROOTS = (CGROUP_ROOT, CGROUP_ROOT / "unified")
V1_MEMORY = CGROUP_ROOT / "memory"


class CgroupUnavailable(RuntimeError):
    """No writable memory cgroup hierarchy on this machine."""


def _lists_memory(root: Path) -> bool:
    try:
        return "memory" in (root / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def detect_hierarchy() -> tuple[int, Path]:
    """(version, root) of the first writable memory hierarchy: v2 first, then v1."""
    for root in V2_ROOTS:
        if _lists_memory(root) and os.access(root, os.W_OK):
            return 2, root
    if (V1_MEMORY / "memory.limit_in_bytes").is_file() and os.access(V1_MEMORY, os.W_OK):
        return 1, V1_MEMORY
    raise CgroupUnavailable("no writable memory cgroup (v2 with 'memory' or v1 memory)")


@dataclass
class MemoryCgroup:
    version: int
    path: Path
    cap_bytes: int
    samples: dict[str, int] = field(default_factory=dict)

    def wrap(self, argv: list[str]) -> list[str]:
        """A command that joins this cgroup, then execs ``argv`` (same pid: all of it counts)."""
        procs = shlex.quote(str(self.path / "cgroup.procs"))
        return ["/bin/sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def _read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def _read_int(self, name: str) -> int | None:
        text = self._read(name)
        return int(text.split()[0]) if text and text.split()[0].isdigit() else None

    def _read_keyed(self, name: str) -> dict[str, int]:
        pairs = (line.split() for line in (self._read(name) or "").splitlines())
        return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].lstrip("-").isdigit()}

    def sample(self) -> None:
        """Track the peak charge the kernel cannot reclaim (anonymous + shared memory, from
        memory.stat) and the file cache beside it, while the child runs."""
        memory = parse_memory_stat(self._read("memory.stat") or "")
        self.samples["peak_charged"] = max(self.samples.get("peak_charged", 0),
                                           memory.charged_bytes)
        self.samples["peak_file"] = max(self.samples.get("peak_file", 0), memory.file_bytes)

    def stats(self) -> dict:
        out = {"version": self.version, "cap_mb": self.cap_bytes / MB,
               "sampled_peak_charged_mb": self.samples.get("peak_charged", 0) / MB,
               "sampled_peak_file_mb": self.samples.get("peak_file", 0) / MB}
        if self.version == 1:
            out.update(self._stats_v1())
        else:
            out.update(self._stats_v2())
        return out

    def _stats_v1(self) -> dict:
        oom = self._read_keyed("memory.oom_control")
        memsw = self._read_int("memory.memsw.max_usage_in_bytes")
        return {"max_usage_mb": (self._read_int("memory.max_usage_in_bytes") or 0) / MB,
                "memsw_max_usage_mb": memsw / MB if memsw is not None else None,
                "failcnt": self._read_int("memory.failcnt"),
                "memsw_failcnt": self._read_int("memory.memsw.failcnt"),
                "oom_kill": oom.get("oom_kill"), "under_oom": oom.get("under_oom")}

    def _stats_v2(self) -> dict:
        events = self._read_keyed("memory.events")
        peak = self._read_int("memory.peak")
        return {"max_usage_mb": peak / MB if peak is not None else None,
                "failcnt": events.get("max"), "oom": events.get("oom"),
                "oom_kill": events.get("oom_kill")}

    def remove(self, attempts: int = 50) -> None:
        for _ in range(attempts):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)  # the exited child can take a moment to leave
        self.path.rmdir()


def create_cgroup(cap_bytes: int, name: str) -> MemoryCgroup:
    version, root = detect_hierarchy()
    path = root / name
    path.mkdir()
    group = MemoryCgroup(version, path, cap_bytes)
    try:
        _set_limits(group)
    except OSError:
        group.remove()
        raise
    return group


def _set_limits(group: MemoryCgroup) -> None:
    cap = str(group.cap_bytes)
    if group.version == 2:
        _enable_v2_memory(group.path.parent)
        (group.path / "memory.max").write_text(cap)
        swap = group.path / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")
        return
    (group.path / "memory.limit_in_bytes").write_text(cap)
    memsw = group.path / "memory.memsw.limit_in_bytes"
    if memsw.exists():  # must come after limit_in_bytes (memsw >= limit)
        memsw.write_text(cap)


def _enable_v2_memory(parent: Path) -> None:
    control = parent / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")
