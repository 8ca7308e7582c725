"""What `make test` builds or installs on a fresh machine (llama-cpp-python from its sdist,
Debian's jemalloc): under plain `pytest` a test module needing what is missing is skipped with
the reason; under `make test` (MEBP_TESTS_REQUIRE_ALL=1) it is a failure, never a skip."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_ALL = "MEBP_TESTS_REQUIRE_ALL"


def import_built(name: str, make_target: str) -> ModuleType:
    """``name`` imported, or this test module skipped (failed under ``make test``)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"{name} is not installed ({exc}); `make {make_target}` builds it")


def missing(why: str) -> None:
    """This test module skipped (failed under ``make test``) for ``why``."""
    if os.environ.get(REQUIRE_ALL) == "1":
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)
