"""What this CPU is and can do, read from ``/proc/cpuinfo``, and how busy its cores are, read
from ``/proc/stat`` (torch-free: the planner and the worker use it).

``matmul_dtype`` decides where bfloat16 matmuls run: natively on CPUs with bf16 matmul
instructions, in float32 on bf16-stored operands elsewhere, where torch's bf16 kernels run
at 1-20 GFLOP/s against 50-190 for float32 (measured on an AVX2 EPYC; the input-gradient
form is the slowest).
"""

from __future__ import annotations

import functools
import math
import os
import platform
import time
from pathlib import Path

# x86: AVX-512 BF16 and AMX; Arm: FEAT_BF16 (the "bf16" of the Features line)
BF16_MATMUL_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def first_field(cpuinfo: str, *names: str) -> str | None:
    """The value of the first ``name : value`` line of ``cpuinfo`` whose name is one of
    ``names``."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in names:
            return value.strip()
    return None


def cpu_model() -> str:
    return first_field(_cpuinfo(), "model name") or platform.processor() or platform.machine()


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The instruction-set flags of the first CPU (x86 ``flags``, Arm ``Features``) of
    ``cpuinfo``, or of this host (parsed once: the planner asks per configuration)."""
    if cpuinfo is None:
        return _host_flags()
    return frozenset((first_field(cpuinfo, "flags", "Features") or "").split())


@functools.cache
def _host_flags() -> frozenset[str]:
    return cpu_flags(_cpuinfo())


def native_bf16_matmul(cpuinfo: str | None = None) -> bool:
    return bool(cpu_flags(cpuinfo) & BF16_MATMUL_FLAGS)


def matmul_dtype(compute_dtype: str, bf16_matmul: str = "auto") -> str:
    """The dtype the engine's matmuls run in for a ``compute_dtype`` and the ``bf16_matmul``
    knob: "native" keeps bfloat16, "float32" upcasts, "auto" upcasts only where the CPU has
    no bf16 matmul instructions."""
    if compute_dtype != "bfloat16" or bf16_matmul == "native":
        return compute_dtype
    if bf16_matmul == "float32" or not native_bf16_matmul():
        return "float32"
    return "bfloat16"


def torch_default_threads(sysfs: Path = Path("/sys/devices/system/cpu"),
                          cpus: set[int] | None = None) -> int:
    """The intra-op thread count torch takes when none is set, found without importing it:
    ``MKL_NUM_THREADS``, else ``OMP_NUM_THREADS``, else the physical cores (distinct package
    and core ids) among the CPUs this process may run on (``cpus``, default its affinity).
    So a calibration keyed by "torch's default" and one keyed by that number are one. (Checked
    against torch under an affinity of one CPU and of all; hyperthreads within an affinity
    mask are counted as their core, which no host here could check.)"""
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    processors = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    cores = set()
    for cpu in processors:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:  # no topology: counted as a core of its own
            cores.add(("cpu", str(cpu)))
    return len(cores) or 1


# a core counts as free when at least this share of it sat idle: threads on a core another
# process keeps busy wait at every parallel region's barrier for their turn (BENCHMARKS: a
# smollm2-135m step at seq 256 on 2 threads beside a busy core ran 6.1x its idle time, on
# one thread 1.6x)
FREE_CORE_SHARE = 0.8


def _cpu_jiffies() -> tuple[int, int] | None:
    """(idle, total) jiffies of all cores since boot, from /proc/stat's first line."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    counts = [int(v) for v in fields[1:9]]  # user .. steal (guest time is counted in user)
    return counts[3] + counts[4], sum(counts)  # idle + iowait


class IdleWindow:
    """Idle cores over a window opened now and read later, so the sampling overlaps work
    (a job's preparation) instead of waiting. This process's own CPU time in the window, and
    that of ``free_pids`` (work of its own that ends before the cores are needed, such as
    the next job's engine importing), counts as idle."""

    def __init__(self, free_pids: tuple[int, ...] = ()) -> None:
        self.opened = time.monotonic()
        self.jiffies = _cpu_jiffies()
        self.own_cpu_s = _own_cpu_s()
        self.free_cpu_s = {pid: process_cpu_s(pid) for pid in free_pids}

    def idle_cores(self, min_window_s: float = 0.1) -> float | None:
        """Idle cores since the window opened, waiting until it is ``min_window_s`` long
        (the kernel counts in ticks of 10 ms or so); None where the kernel does not say."""
        time.sleep(max(0.0, self.opened + min_window_s - time.monotonic()))
        after, elapsed = _cpu_jiffies(), time.monotonic() - self.opened
        if self.jiffies is None or after is None or after[1] <= self.jiffies[1]:
            return None
        cores = os.cpu_count() or 1
        idle = (after[0] - self.jiffies[0]) / (after[1] - self.jiffies[1]) * cores
        free_s = _own_cpu_s() - self.own_cpu_s + sum(
            max(0.0, process_cpu_s(pid) - before) for pid, before in self.free_cpu_s.items())
        return min(cores, idle + free_s / elapsed)


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def process_cpu_s(pid: int) -> float:
    """The CPU time process ``pid`` has used (user + system), 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 on; the name may hold spaces
    return (int(fields[14 - 3]) + int(fields[15 - 3])) / os.sysconf("SC_CLK_TCK")


def idle_cores(window_s: float = 0.3) -> float | None:
    """How many cores' worth of time sat idle over the next ``window_s`` seconds; None where
    the kernel does not say."""
    before = _cpu_jiffies()
    time.sleep(window_s)
    after = _cpu_jiffies()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)


def threads_for_idle_cores(idle: float | None, cores: int | None = None) -> int:
    """As many threads as there are free cores (at least one); all of them where the load
    is unknown."""
    cores = cores or os.cpu_count() or 1
    if idle is None:
        return cores
    return max(1, min(cores, math.floor(idle + 1 - FREE_CORE_SHARE)))
