"""Service faults, each made real by stopping or starving what the test started itself:
Redis restarted empty, the database down, the storage full."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from service_harness import FAST_RECOVERY, free_port, start_service, stop_service, tiny_job

ROWS = b"".join(json.dumps({"text": f"service fault row {i}"}).encode() + b"\n"
                for i in range(16))


@pytest.fixture
def own_redis():
    """A redis-server of the test's own on a free port, keeping nothing on disk."""
    port = free_port()
    command = [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no"]

    def start() -> subprocess.Popen:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
        return process
    servers = [start()]
    yield f"redis://127.0.0.1:{port}/0", servers, start
    for server in servers:
        server.kill()
        server.wait()


def test_redis_restarted_empty_loses_nothing_and_is_a_503_while_down(tmp_path, model_cache,
                                                                       own_redis):
    url, servers, restart = own_redis
    service = start_service(tmp_path, model_cache, {**FAST_RECOVERY, "REDIS_URL": url})
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        jobs = [service.request("POST", "/v1/jobs", tiny_job(dataset, 20))[1]["id"]
                for _ in range(3)]
        servers[0].kill()  # the queue is gone with it
        servers[0].wait()
        response = service.client.post("/v1/jobs", json=tiny_job(dataset, 2))
        assert response.status_code == 503, response.text
        assert "Redis" in response.json()["detail"] and response.headers["retry-after"]
        health = httpx.get(service.url + "/v1/health")
        assert health.status_code == 503 and health.json()["redis"] == "unavailable"
        assert service.client.get(f"/v1/jobs/{jobs[0]}").status_code == 200  # the database
        servers.append(restart())
        for job_id in jobs:
            done = service.finished(job_id, timeout_s=180)
            assert done["status"] == "succeeded", done
            terminal = [e for e in service.job_events(job_id)
                        if e["data"].get("status") in ("succeeded", "failed", "cancelled")]
            assert len(terminal) == 1
        assert service.request("GET", "/v1/jobs")[1]["count"] == 3  # the refused one was not made
    finally:
        stop_service(service)


@pytest.fixture
def own_postgres():
    """A PostgreSQL cluster of the test's own, run as the postgres user (in a directory it
    can reach: pytest's are private to root)."""
    bin_dir = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1])
    home, port = Path(tempfile.mkdtemp(prefix="mebp-pg-")), free_port()
    os.chmod(home, 0o755)
    shutil.chown(home, "postgres")
    data = home / "data"

    def pg(*args: str, check: bool = True) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(bin_dir / args[0]), *args[1:]],
                       check=check, capture_output=True, timeout=120)

    def start() -> None:
        pg("pg_ctl", "-D", str(data), "-l", str(home / "log"), "-w", "-o",
           f"-p {port} -k {home} -h 127.0.0.1", "start")

    def stop(check: bool = True) -> None:
        pg("pg_ctl", "-D", str(data), "-m", "immediate", "stop", check=check)

    pg("initdb", "-D", str(data), "-A", "trust", "-U", "postgres")
    start()
    yield f"postgresql://postgres@127.0.0.1:{port}/postgres", start, stop
    stop(check=False)
    shutil.rmtree(home, ignore_errors=True)


def test_the_database_down_is_a_503_and_the_service_carries_on(tmp_path, model_cache,
                                                                own_postgres):
    url, start, stop = own_postgres
    service = start_service(tmp_path / "service", model_cache, {"DATABASE_URL": url})
    try:
        assert service.client.get("/v1/jobs").status_code == 200
        stop()
        for path in ("/v1/jobs", "/v1/datasets", "/v1/devices"):
            response = service.client.get(path)
            assert response.status_code == 503, (path, response.text)
            assert response.json() == {"detail": "the database is unavailable; retry shortly"}
        assert httpx.get(service.url + "/v1/health").json()["database"] == "unavailable"
        start()
        assert service.client.get("/v1/jobs").status_code == 200
        assert service.process.poll() is None
    finally:
        stop_service(service)


@pytest.fixture
def small_storage(tmp_path):
    """A 400 KB tmpfs as the storage root: room for a dataset and a job's logs, not for
    its adapter."""
    storage = tmp_path / "storage"
    storage.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(storage)],
                   check=True)
    yield storage
    subprocess.run(["umount", "-l", str(storage)], check=True)


def test_a_full_disk_while_writing_the_adapter_fails_the_job_and_keeps_nothing(
        tmp_path, model_cache, small_storage):
    service = start_service(tmp_path / "service", model_cache,
                            {"MEBP_STORAGE_DIR": str(small_storage)})
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, 3, checkpoint_every=1000))
        done = service.finished(job[1]["id"])
        assert done["status"] == "failed" and done["error"]["code"] == "storage_full", done["error"]
        assert done["adapter"] is None
        assert service.client.get(f"/v1/jobs/{done['id']}/adapter").status_code == 404
        job_dir = small_storage / "jobs" / done["id"]
        assert not [p for p in job_dir.iterdir() if p.name.startswith((".adapter", "adapter"))]
        after = service.request("POST", "/v1/jobs", tiny_job(dataset, 1))[1]
        assert service.finished(after["id"])["status"] in ("succeeded", "failed")
    finally:
        stop_service(service)

