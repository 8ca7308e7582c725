"""The host measurement's child process: it never outlives the process waiting for it (a
service stopped while it measures leaves nothing behind). The calibration's key: one host at
one thread count is one calibration."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
from waiting import poll_until

from mebp_core.cpu import torch_default_threads
from mebp_core.plan.calibration import calibration_path

MEASURING_PARENT = """
from mebp_core.plan.calibration import measure_host
measure_host()
"""


def test_the_measurement_child_dies_with_the_process_waiting_for_it():
    parent = subprocess.Popen([sys.executable, "-c", MEASURING_PARENT])
    try:
        def measuring_child() -> psutil.Process | None:
            for child in psutil.Process(parent.pid).children():
                if "mebp_core.measure_host" in " ".join(child.cmdline()):
                    return child
            return None
        # the parent imports, then starts it
        child = poll_until(measuring_child, lambda c: c is not None or parent.poll() is not None,
                           120, lambda _: "the measurement never started")
        assert child is not None, "the parent exited before measuring"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert not alive, f"the measurement outlived its parent: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_torchs_default_thread_count_named_or_left_unset_is_one_calibration(tmp_path):
    default = torch_default_threads()
    assert calibration_path(tmp_path, None) == calibration_path(tmp_path, default)
    assert calibration_path(tmp_path, None) != calibration_path(tmp_path, default + 1)
