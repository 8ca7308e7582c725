"""The workload most plan tests predict for: qwen2.5-0.5b at 256 tokens."""

from __future__ import annotations

import pytest

from mebp_core.plan.arch import load_architecture
from mebp_core.plan.workload import Workload


@pytest.fixture
def workload() -> Workload:
    return Workload(arch=load_architecture("preset:qwen2.5-0.5b"), seq_len=256)
