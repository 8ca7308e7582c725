"""The load script, bounded: a burst of jobs against two workers all end exactly once (the
full 300-job run and its latency figures are in BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_burst_of_jobs_ends_each_exactly_once(tmp_path, model_cache):
    report = tmp_path / "load.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "service_load.py"),
                           "--jobs", "8", "--workers", "2", "--json", str(report)],
                          capture_output=True, text=True, timeout=900,
                          env={**env, "MEBP_CACHE_DIR": str(model_cache)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["statuses"] == {"succeeded": 8} and result["listed"] == 8
    assert result["lost"] == [] and result["duplicated"] == [] and result["distinct_ids"] == 8
    assert result["get_job_calls"] > 0
