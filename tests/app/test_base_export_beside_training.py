"""A base export never waits behind a training job: `mebp serve` with one worker, and `mebp
worker` alone, each run an exports worker beside their training workers, so an export asked
for while the only training worker runs a job (its engine held) is made while that job still
runs. Real processes over the embedded Redis and SQLite."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from held_engines import hold_engine, release
from service_harness import service_env, start_service, stop_service, tiny_job

ROWS = b"".join(json.dumps({"text": f"export row {i}"}).encode() + b"\n" for i in range(16))

pytestmark = pytest.mark.slow


def start_worker_alone(root, cache) -> subprocess.Popen:
    """`mebp worker` on the service's data dir and embedded Redis."""
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker"], start_new_session=True,
        env=service_env(cache, {"MEBP_DATA_DIR": str(root / "data"),
                                "REDIS_URL": f"unix://{root / 'data' / 'redis.socket'}"}))


@pytest.mark.parametrize("workers", ["serve", "worker alone"])
def test_an_export_is_made_while_the_only_worker_runs_a_training_job(
        tmp_path, model_cache, workers):
    service = start_service(tmp_path, model_cache, {}, workers=1 if workers == "serve" else 0)
    alone = start_worker_alone(tmp_path, model_cache) if workers == "worker alone" else None
    engine = None
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, 200))[1]
        engine = hold_engine(tmp_path / "data" / "storage", job["id"], 1)
        made = service.base("preset:tiny", timeout_s=300, format="gguf", quant="q8_0")
        assert made.status_code == 200, made.text
        assert made.content[:4] == b"GGUF"
        running = service.request("GET", f"/v1/jobs/{job['id']}")[1]
        assert running["status"] == "running", running  # made beside it, not after it
    finally:
        if engine is not None:
            release(engine)
        if alone is not None:
            alone.terminate()
            alone.wait(timeout=60)
        stop_service(service)
