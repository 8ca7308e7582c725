"""The memory cap on this machine's real kernel: a cgroup (v2 where its memory controller is
usable, else v1) kills a process past its limit and reports it, and is always removed; the
rlimit fallback makes the allocation fail instead."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from mebp_core.units import MB
from worker.memory_cap import (
    IDLE_CAP_AGE_S,
    MemoryCapError,
    RlimitCap,
    open_memory_cap,
    remove_idle_caps,
    v1_hierarchy,
    v2_hierarchy,
)

ALLOCATE = "import sys; block = b'x' * (int(sys.argv[1]) << 20)"  # every page written


def run_capped(cap, allocate_mb: int) -> subprocess.CompletedProcess:
    """A process that joins the cap from its environment, as the engine does, then
    allocates."""
    code = "from worker.memory_cap import join_from_env; join_from_env(); " + ALLOCATE
    return subprocess.run([sys.executable, "-c", code, str(allocate_mb)],
                          env={**os.environ, **cap.child_env()}, capture_output=True,
                          text=True, timeout=60)


def test_auto_takes_a_cgroup_here_preferring_v2():
    cap, warning = open_memory_cap("auto", f"test-{uuid.uuid4().hex[:8]}", 256 * MB)
    try:
        expected = "cgroup-v2" if v2_hierarchy() else "cgroup-v1" if v1_hierarchy() else "rlimit"
        assert cap.mode == expected and (warning is None) == (expected != "rlimit")
    finally:
        cap.close()


def test_a_cgroup_kills_past_its_limit_reports_the_peak_and_is_removed():
    cap, _ = open_memory_cap("auto", f"test-{uuid.uuid4().hex[:8]}", 96 * MB)
    if cap.mode == "rlimit":
        cap.close()
        pytest.fail("this machine can make a memory cgroup; open_memory_cap did not")
    try:
        done = run_capped(cap, 400)
        assert done.returncode == -9  # SIGKILL from the kernel's OOM killer
        assert cap.oom_killed()
        assert 0.9 * 96 * MB <= cap.peak_bytes() <= 96 * MB
    finally:
        cap.close()
    assert not cap.path.exists()


def test_a_cgroup_lets_a_process_within_its_limit_finish():
    cap, _ = open_memory_cap("auto", f"test-{uuid.uuid4().hex[:8]}", 256 * MB)
    try:
        done = run_capped(cap, 64)
        assert done.returncode == 0, done.stderr
        assert not cap.oom_killed() and cap.peak_bytes() >= 64 * MB
    finally:
        cap.close()


def test_the_rlimit_fallback_fails_the_allocation():
    cap, warning = open_memory_cap("rlimit", "unused", 200 * MB)
    assert isinstance(cap, RlimitCap) and warning is None
    done = run_capped(cap, 400)
    assert done.returncode == 1 and "MemoryError" in done.stderr
    assert run_capped(cap, 32).returncode == 0


def test_asking_for_a_hierarchy_the_machine_lacks_is_an_error(tmp_path):
    with pytest.raises(MemoryCapError, match="cgroup-v2: no hierarchy"):
        open_memory_cap("cgroup-v2", "x", 64 * MB, root=tmp_path)
    cap, warning = open_memory_cap("auto", "x", 64 * MB, root=tmp_path)
    assert cap.mode == "rlimit" and "falling back to RLIMIT_DATA" in warning


def test_the_idle_sweep_spares_a_cap_just_made_and_takes_an_old_empty_one():
    """(The machine's own groups: a sweep of every idle group would also take the waiting
    groups other tests' workers have just made, so the old one is made old instead.)"""
    young, _ = open_memory_cap("auto", f"job-young{uuid.uuid4().hex[:6]}-a1", 64 * MB)
    old, _ = open_memory_cap("auto", f"job-old{uuid.uuid4().hex[:6]}-a1", 64 * MB)
    try:
        remove_idle_caps()
        assert young.path.exists() and old.path.exists()  # made a moment ago: in use soon
        long_ago = time.time() - IDLE_CAP_AGE_S - 60
        os.utime(old.path, (long_ago, long_ago))
        remove_idle_caps()
        assert young.path.exists() and not old.path.exists()
    finally:
        young.close()
        old.close()
