"""Loading an engine caps malloc's arenas at one: torch's worker threads allocate from the
arena the main thread frees into (``mebp_core.proc.use_one_malloc_arena``)."""

from __future__ import annotations

import sys

import pytest
from malloc_arenas import arenas_after


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_loading_an_engine_sets_one_arena(packed_models):
    assert arenas_after("engine", str(packed_models["llama", "int4"])) == 1
