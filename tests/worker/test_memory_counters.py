"""The engine's per-step peaks from its job cgroup's own counters (no sampling thread), on
this machine's real kernel: an anonymous block and a shared mapping freed within a step are
caught, mapped file pages are reported apart, every step's window restarts, and the figures
agree with a 1 ms sampling thread running beside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from mebp_core.engine.memory import MemorySampler, track_memory
from mebp_core.units import MB
from worker.memory_cap import open_memory_cap

STEPS = r"""
import json, mmap, os, sys, time
from worker.memory_cap import join_from_env
join_from_env()
from mebp_core.engine.memory import MemorySampler, track_memory

SIZE = 64 << 20
store = sys.argv[1]
counters = track_memory()
thread = MemorySampler(interval_s=0.001)
steps = []
with counters, thread:
    def step(name, work):
        work()
        steps.append({"name": name, "counters": counters.take_step_peak(),
                      "thread": thread.take_step_peak()})

    def anonymous():
        block = bytearray(SIZE)
        for offset in range(0, SIZE, 4096):
            block[offset] = 1
        time.sleep(0.01)  # let the 1 ms thread see it too (the loop above holds the GIL)
        del block

    def shared():
        mapping = mmap.mmap(-1, SIZE)  # MAP_SHARED: the kernel's shmem
        for offset in range(0, SIZE, 4096):
            mapping[offset] = 1
        time.sleep(0.01)
        mapping.close()

    def mapped_file():
        with open(store, "rb") as file:
            # pages another cgroup read stay charged to it: drop them, so this one reads
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            sum(mapping[offset] for offset in range(0, SIZE, 4096))
            mapping.close()

    step("anonymous", anonymous)
    step("shared", shared)
    step("file", mapped_file)
    step("idle", lambda: None)
print(json.dumps({"method": counters.method, "steps": steps,
                  "baselines": [counters.baseline_bytes, thread.baseline_bytes],
                  "peak_file": counters.peak_file_bytes,
                  "usage_peak": counters.usage_peak_bytes}))
"""


@pytest.fixture
def capped_run(tmp_path):
    cap, _ = open_memory_cap("auto", f"test-{uuid.uuid4().hex[:8]}", 1024 * MB)
    if cap.mode == "rlimit":
        cap.close()
        pytest.fail("this machine can make a memory cgroup; open_memory_cap did not")
    store = tmp_path / "store.bin"
    with open(store, "wb") as file:
        file.write(b"\2" * (64 * MB))
        os.fsync(file.fileno())  # clean pages, so the engine's process can drop them
    try:
        done = subprocess.run([sys.executable, "-c", STEPS, str(store)],
                              env={**os.environ, **cap.child_env()}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        yield cap, json.loads(done.stdout)
    finally:
        cap.close()


def test_step_peaks_come_from_the_cgroup_counters_and_match_a_sampling_thread(capped_run):
    cap, run = capped_run
    assert run["method"].startswith(f"{cap.mode} counters")
    counters_base, thread_base = run["baselines"]
    above = {step["name"]: ((step["counters"] - counters_base) / MB,
                            (step["thread"] - thread_base) / MB) for step in run["steps"]}
    for name in ("anonymous", "shared"):  # freed before the step ended, caught all the same
        by_counters, by_thread = above[name]
        assert 60 < by_counters < 72, (name, above)
        assert abs(by_counters - by_thread) < 4, (name, above)
    assert above["file"][0] < 6, above  # clean file pages: not charged
    assert above["idle"][0] < 6, above  # the window restarted after the big steps
    assert run["peak_file"] / MB > 60  # ...but reported apart
    assert run["usage_peak"] >= max(step["counters"] for step in run["steps"])  # a bound


def test_without_a_cgroup_of_its_own_the_process_falls_back_to_sampling():
    # pytest shares its cgroup (if any) with the rest of this machine's processes
    assert isinstance(track_memory(), MemorySampler)
    with pytest.raises(RuntimeError, match="no memory cgroup of its own"):
        track_memory("cgroup")
