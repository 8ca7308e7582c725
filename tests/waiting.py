"""The one way these tests wait on state another thread or process changes: poll it
until a condition holds, within a deadline that only guards against a hang."""

from __future__ import annotations

import time

# How long a wait on a job, an export or a fleet may take before the test calls it hung: a
# guard, not a bound on the product's speed (the suite must pass on a host at load 10).
HANG_GUARD_S = 300


def poll_until(probe, done, timeout_s: float, failure, interval_s: float = 0.2):
    """``probe()`` again every ``interval_s`` until ``done(value)``; the value, or an
    AssertionError with ``failure(value)`` once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while not done(value := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(failure(value))
        time.sleep(interval_s)
    return value
