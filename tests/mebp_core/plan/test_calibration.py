"""The host measurement's child process: it never outlives the process waiting for it (a
service stopped while it measures leaves nothing behind)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

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
        deadline = time.monotonic() + 120  # the parent imports, then starts it
        while (child := measuring_child()) is None:
            assert parent.poll() is None and time.monotonic() < deadline, \
                "the measurement never started"
            time.sleep(0.1)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert not alive, f"the measurement outlived its parent: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
