"""A kernel-enforced memory cap for one job's engine process.

In order of preference: a fresh cgroup v2 (``memory.max``, ``memory.swap.max`` 0,
``memory.oom.group``), a fresh cgroup v1 (``memory.limit_in_bytes`` and, where swap is
accounted, ``memory.memsw.limit_in_bytes``) when no v2 hierarchy has the memory controller,
and an ``RLIMIT_DATA`` when no cgroup can be made. ``mode`` says which one a job got.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import time
from pathlib import Path

from mebp_core.kernel_memory import CGROUP_ROOT

GROUP_PARENT = "mebp"  # every job's cgroup lives under <hierarchy>/mebp/
PROCS_ENV, RLIMIT_ENV = "MEBP_CAP_CGROUP_PROCS", "MEBP_CAP_RLIMIT_DATA"
WAITING_PREFIX = "waiting-"  # an engine's cgroup before its job names it (worker.warm_engine)


def join_from_env(env: dict | None = None) -> None:
    """In the engine process, first thing: enter the cap its worker made (named in its
    environment), before anything it allocates goes uncounted."""
    env = os.environ if env is None else env
    if PROCS_ENV in env:
        Path(env[PROCS_ENV]).write_text(str(os.getpid()))
    if RLIMIT_ENV in env:
        limit = int(env[RLIMIT_ENV])
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


class MemoryCapError(RuntimeError):
    """The requested enforcement cannot be set up on this machine."""


class LimitRefused(MemoryCapError):
    """The kernel refused a limit below what the group already holds (cgroup v1's EBUSY):
    the engine's runtime alone is over the job's budget."""


class RlimitCap:
    """``RLIMIT_DATA`` on the child: an allocation past the budget fails in the engine,
    which reports it; not a kernel kill, and only the process's own data segment counts."""

    mode = "rlimit"

    def __init__(self, limit_bytes: int | None) -> None:
        self.limit_bytes = limit_bytes

    def child_env(self) -> dict[str, str]:
        return {} if self.limit_bytes is None else {RLIMIT_ENV: str(self.limit_bytes)}

    def holds(self, pid: int) -> bool:
        return True  # a process's own limit: nothing to join

    def set_limit(self, limit_bytes: int, pid: int) -> None:
        """Limit the engine ``pid`` started without one (``prlimit``)."""
        resource.prlimit(pid, resource.RLIMIT_DATA, (limit_bytes, limit_bytes))
        self.limit_bytes = limit_bytes

    def rename(self, name: str) -> None:
        pass

    def peak_bytes(self) -> int | None:
        return None

    def oom_killed(self) -> bool:
        return False

    def close(self) -> None:
        pass


class _CgroupCap:
    mode = ""
    _procs = "cgroup.procs"

    def __init__(self, path: Path, limit_bytes: int | None) -> None:
        self.path, self.limit_bytes = path, limit_bytes

    def child_env(self) -> dict[str, str]:
        return {PROCS_ENV: str(self.path / self._procs)}

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` has joined the group."""
        return str(pid) in (self.path / self._procs).read_text().split()

    def rename(self, name: str) -> None:
        """Give the group another name under the same parent, where the kernel allows it
        (cgroup v1, with processes inside; one still to join by its old name could not)."""
        self.path = self.path.rename(self.path.with_name(name))

    @classmethod
    def configured(cls, path: Path, limit_bytes: int, files: dict[str, str]):
        """The cap at ``path`` with each control file written (a name ending in ``?`` only
        where the kernel offers it); removed again if the kernel refuses one."""
        cap = cls(path, limit_bytes)
        try:
            for name, value in files.items():
                optional, name = name.endswith("?"), name.removesuffix("?")
                if not optional or (path / name).exists():
                    (path / name).write_text(value)
        except OSError:
            cap.close()
            raise
        return cap

    def close(self) -> None:
        """Kill whatever is left in the group and remove it (retrying while it drains)."""
        for _ in range(50):
            try:
                for pid in (self.path / self._procs).read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except (OSError, ProcessLookupError):
                time.sleep(0.1)
        raise MemoryCapError(f"could not remove cgroup {self.path}")

    def _read_int(self, name: str) -> int | None:
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _read_keyed(self, name: str) -> dict[str, int]:
        try:
            lines = (self.path / name).read_text().splitlines()
        except OSError:
            return {}
        return {k: int(v) for k, v in (line.split() for line in lines if line.strip())}


class CgroupV2Cap(_CgroupCap):
    mode = "cgroup-v2"

    @classmethod
    def create(cls, hierarchy: Path, name: str, limit_bytes: int | None) -> CgroupV2Cap:
        parent = hierarchy / GROUP_PARENT
        parent.mkdir(exist_ok=True)
        for node in (hierarchy, parent):  # the memory controller must reach the leaf
            enabled = (node / "cgroup.subtree_control").read_text().split()
            if "memory" not in enabled:
                (node / "cgroup.subtree_control").write_text("+memory")
        path = parent / name
        path.mkdir()
        # no swap, and an OOM kills the whole group, not one process of it
        return cls.configured(path, limit_bytes, {"memory.max": _v2_limit(limit_bytes),
                                                  "memory.swap.max?": "0",
                                                  "memory.oom.group": "1"})

    def rename(self, name: str) -> None:
        """cgroup v2 renames no group (EPERM): an engine started ahead keeps its waiting
        name; its horse removes the group, or the next worker start once it is empty."""

    def set_limit(self, limit_bytes: int, pid: int) -> None:
        """Lower the limit of a group made without one: the kernel reclaims, or kills the
        group, if its usage is above it."""
        (self.path / "memory.max").write_text(_v2_limit(limit_bytes))
        self.limit_bytes = limit_bytes

    def peak_bytes(self) -> int | None:
        return self._read_int("memory.peak")

    def limit_hits(self) -> int | None:
        """How often usage ran into the limit (reclaim, or an OOM kill)."""
        return self._read_keyed("memory.events").get("max")

    def oom_killed(self) -> bool:
        return self._read_keyed("memory.events").get("oom_kill", 0) > 0


class CgroupV1Cap(_CgroupCap):
    mode = "cgroup-v1"

    @classmethod
    def create(cls, hierarchy: Path, name: str, limit_bytes: int | None) -> CgroupV1Cap:
        path = hierarchy / GROUP_PARENT / name
        path.mkdir(parents=True)
        if limit_bytes is None:
            return cls(path, None)
        # memory+swap at the same limit (where swap is accounted): no spilling into swap
        return cls.configured(path, limit_bytes, {
            "memory.limit_in_bytes": str(limit_bytes),
            "memory.memsw.limit_in_bytes?": str(limit_bytes)})

    def set_limit(self, limit_bytes: int, pid: int) -> None:
        """Limit a group made without one; the kernel refuses (EBUSY) when its usage is
        above the limit and cannot be reclaimed. Memory first: memory+swap may not be
        set below it."""
        try:
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            raise LimitRefused(f"{self.path} holds more than {limit_bytes} bytes") from None
        if (self.path / "memory.memsw.limit_in_bytes").exists():
            (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        self.limit_bytes = limit_bytes

    def peak_bytes(self) -> int | None:
        return self._read_int("memory.max_usage_in_bytes")

    def limit_hits(self) -> int | None:
        """How often usage ran into the limit (reclaim, or an OOM kill)."""
        return self._read_int("memory.failcnt")

    def oom_killed(self) -> bool:
        control = self._read_keyed("memory.oom_control")
        if "oom_kill" in control:
            return control["oom_kill"] > 0
        return (self._read_int("memory.failcnt") or 0) > 0  # kernels before 4.13


MemoryCap = RlimitCap | CgroupV2Cap | CgroupV1Cap


def _v2_limit(limit_bytes: int | None) -> str:
    return "max" if limit_bytes is None else str(limit_bytes)


def v2_hierarchy(root: Path = CGROUP_ROOT) -> Path | None:
    """The cgroup v2 mount whose root offers the memory controller, if any."""
    for candidate in (root, root / "unified"):
        controllers = candidate / "cgroup.controllers"
        if controllers.is_file() and "memory" in controllers.read_text().split():
            return candidate
    return None


def v1_hierarchy(root: Path = CGROUP_ROOT) -> Path | None:
    path = root / "memory"
    return path if (path / "memory.limit_in_bytes").is_file() else None


def remove_stale_caps(job_id: str, root: Path = CGROUP_ROOT) -> None:
    """Kill and remove the cgroups of a job's earlier attempts (a worker that died while
    holding one could not)."""
    for path, cap_class in _job_groups(f"{job_id}-a*", root):
        cap_class(path, 0).close()


IDLE_CAP_AGE_S = 600.0  # far longer than a cap waits between its making and its engine


def remove_idle_caps(root: Path = CGROUP_ROOT, older_than_s: float = IDLE_CAP_AGE_S) -> None:
    """Remove the job cgroups no process is left in (the kernel refuses the others) that
    are old enough not to be one another worker has just made for an engine still starting."""
    cutoff = time.time() - older_than_s
    groups = [*_job_groups("job-*", root), *_job_groups(f"{WAITING_PREFIX}*", root)]
    for path, _ in groups:
        try:
            if path.stat().st_mtime < cutoff:
                path.rmdir()
        except OSError:
            pass


def _job_groups(pattern: str, root: Path):
    for hierarchy, cap_class in ((v2_hierarchy(root), CgroupV2Cap),
                                 (v1_hierarchy(root), CgroupV1Cap)):
        if hierarchy is not None:
            for path in (hierarchy / GROUP_PARENT).glob(pattern):
                yield path, cap_class


def open_memory_cap(enforcement: str, name: str, limit_bytes: int | None,
                    root: Path = CGROUP_ROOT) -> tuple[MemoryCap, str | None]:
    """A cap of ``limit_bytes`` by ``enforcement`` (auto, cgroup-v2, cgroup-v1, rlimit);
    with auto, the best this machine allows and, when that is not a cgroup, why. Without a
    limit, the cap is made for an engine started ahead of its job (``set_limit`` later)."""
    attempts = {"cgroup-v2": (v2_hierarchy, CgroupV2Cap),
                "cgroup-v1": (v1_hierarchy, CgroupV1Cap)}
    wanted = list(attempts) if enforcement == "auto" else [enforcement]
    reasons = []
    for mode in wanted:
        if mode == "rlimit":
            return RlimitCap(limit_bytes), None
        find, cap_class = attempts[mode]
        hierarchy = find(root)
        if hierarchy is None:
            reasons.append(f"{mode}: no hierarchy with the memory controller")
            continue
        try:
            return cap_class.create(hierarchy, name, limit_bytes), None
        except OSError as exc:
            reasons.append(f"{mode}: {exc.strerror or exc} ({hierarchy})")
    if enforcement != "auto":
        raise MemoryCapError("; ".join(reasons))
    return RlimitCap(limit_bytes), "no cgroup could be made (" + "; ".join(reasons) + \
        "): falling back to RLIMIT_DATA"
