"""The host's read-ahead cost: measured by the calibration, and what the planner prices a
direct step's reads at."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mebp_core import measure_host
from mebp_core.plan.planner import make_plan
from mebp_core.plan.store_reads import READ_AHEAD_COST
from mebp_core.units import MB

DIRECT_ID = "lazy-ckpt1-ram-h-recompute-shared-tile8M-direct"


def test_it_is_measured_beside_a_real_matmul_loop(monkeypatch, tmp_path):
    """A share of the reads' time, within [0, 1], from a fresh file in the cache dir."""
    monkeypatch.setattr(measure_host, "default_cache_dir", lambda: tmp_path)
    with measure_host._scratch_file() as scratch:
        cost = measure_host._read_ahead_cost(scratch, 1e9, torch.Generator().manual_seed(0))
    assert cost is not None and 0.0 <= cost <= 1.0
    assert list(tmp_path.iterdir()) == []  # its file is gone


def test_a_direct_step_is_priced_at_the_hosts_cost(workload, host):
    costs = {}
    for cost in (None, 0.0, 1.0):
        plan = make_plan(workload, replace(host, read_ahead_cost=cost),
                         budget_bytes=8000 * MB)
        costs[cost] = next(e for e in plan.entries if e.id == DIRECT_ID).prediction
    read = costs[1.0].direct_read_cost_bytes  # everything at the disk's rate
    in_line = costs[0.0].direct_read_cost_bytes  # only what the step waits for
    assert 0 < in_line < 0.1 * read
    assert costs[None].direct_read_cost_bytes == pytest.approx(
        in_line + READ_AHEAD_COST * (read - in_line))
    assert costs[0.0].time["disk"] < costs[None].time["disk"] < costs[1.0].time["disk"]
