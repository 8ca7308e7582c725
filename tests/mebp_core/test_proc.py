"""Process-wide settings of the C runtime."""

from __future__ import annotations

import sys

import pytest
from malloc_arenas import arenas_after


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_threads_started_after_the_setting_share_one_arena():
    assert arenas_after("default") > 1  # without it, a thread that allocates gets its own
    assert arenas_after("setting") == 1
