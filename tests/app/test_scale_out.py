"""`mebp worker` scales out: an API with no worker of its own, and two `mebp worker`
processes sharing its Redis, PostgreSQL and storage, run two jobs at once."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from service_harness import (
    REDIS_TEST_URL,
    service_env,
    start_service,
    stop_service,
    temporary_postgres_database,
)

ROWS = b"".join(json.dumps({"text": f"scale out {i}"}).encode() + b"\n" for i in range(8))
LONG_JOB = {"model": "preset:tiny", "device": "pixel-8",
            "hyperparameters": {"steps": 100_000, "seq_len": 32}}


def test_two_workers_on_a_shared_redis_and_database_run_jobs_side_by_side(tmp_path,
                                                                          model_cache):
    with temporary_postgres_database() as database:
        env = {"DATABASE_URL": database, "REDIS_URL": REDIS_TEST_URL,
               "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}",
               "MEBP_STORAGE_DIR": str(tmp_path / "shared-storage")}
        service = start_service(tmp_path / "api", model_cache, env, workers=0)
        workers = [subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--data-dir",
                                     str(tmp_path / f"worker-{i}")],
                                    env=service_env(model_cache, env))
                   for i in range(2)]
        try:
            dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
            jobs = [service.request("POST", "/v1/jobs", {**LONG_JOB, "training_file": dataset})
                    [1]["id"] for _ in range(2)]
            for job in jobs:
                service.wait_for(job, lambda j: j["progress"]["step"] >= 1, timeout_s=60)
            # both are running at once, each on its own worker
            states = [service.request("GET", f"/v1/jobs/{job}")[1]["status"] for job in jobs]
            assert states == ["running", "running"]
            started_on = {next(e["data"]["worker"] for e in
                               service.job_events(job)
                               if e["data"].get("status") == "running") for job in jobs}
            assert len(started_on) == 2
            for job in jobs:
                service.request("POST", f"/v1/jobs/{job}/cancel")
            for job in jobs:
                assert service.finished(job, timeout_s=30)["status"] == "cancelled"
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(timeout=30)
            stop_service(service)
