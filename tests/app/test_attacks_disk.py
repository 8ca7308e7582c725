"""A full disk, made real with small tmpfs mounts under a real ``mebp serve``: an upload is a
507 that leaves nothing, a job ends ``failed`` with ``storage_full`` wherever the disk filled
(before the engine started, or under the database and Redis too), even when it was started
with almost no room, and health says so; a submit the database has no room for is a 507 on
SQLite and on PostgreSQL (its tablespace on a tmpfs), not "the database is unavailable"."""

from __future__ import annotations

import errno
import json
import os
import pwd
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from service_harness import (
    POSTGRES_ADMIN,
    TERMINAL,
    in_process_service,
    start_service,
    stop_service,
    tiny_job,
)

from app.main import DATABASE_DISK_FULL

ROWS = b"".join(json.dumps({"text": f"disk row {i}"}).encode() + b"\n" for i in range(16))


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(path, size)``: a tmpfs of that size at ``path``, unmounted after the test."""
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       check=True)
        mounted.append(path)
        return path
    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its filesystem has not one byte left."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        for size in (1 << 20, 4096, 1):
            try:
                while out.write(b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return filler


def leave_free(filler: Path, free_bytes: int) -> None:
    """Give ``free_bytes`` of a full disk back (about: tmpfs counts in pages)."""
    os.truncate(filler, filler.stat().st_size - free_bytes)


def health(service) -> httpx.Response:
    return httpx.get(service.url + "/v1/health", timeout=30)


def test_an_upload_that_fills_the_storage_is_a_507_and_leaves_nothing(tmp_path, model_cache,
                                                                       tmpfs):
    storage = tmpfs(tmp_path / "storage", "400k")
    service = start_service(tmp_path / "service", model_cache, {
        "MEBP_STORAGE_DIR": str(storage), "MEBP_MAX_UPLOAD_BYTES": str(4 << 20)})
    try:
        line = json.dumps({"text": "z" * 3900}).encode() + b"\n"
        status, body = service.upload("large.jsonl", line * 300)  # 1.2 MB into 400 KB
        assert status == 507 and "storage is full" in body["detail"], body
        assert not list((storage / "datasets").iterdir())  # no staging file is left
        filler = fill(storage)  # not a byte left: a small file fails when it is flushed
        status, body = service.upload("small.jsonl", ROWS)
        assert status == 507 and "storage is full" in body["detail"], body
        assert not list((storage / "datasets").iterdir())
        filler.unlink()
        assert service.upload("small.jsonl", ROWS)[0] == 201  # the space came back
    finally:
        stop_service(service)
    assert "Traceback" not in service.output.read_text()


def test_a_job_with_no_byte_free_fails_storage_full_and_a_fleet_is_a_507(
        tmp_path, model_cache, tmpfs):
    storage = tmpfs(tmp_path / "storage", "400k")
    service = start_service(tmp_path / "service", model_cache,
                            {"MEBP_STORAGE_DIR": str(storage)})
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        fill(storage)
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, 1))[1]
        done = service.finished(job["id"], timeout_s=90)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "storage_full", done["error"]
        assert done["adapter"] is None
        status, body = service.request("POST", "/v1/fleets", {  # its shards cannot be written
            "model": "preset:tiny", "training_file": dataset,
            "simulated": {"device": "pixel-8", "count": 2},
            "hyperparameters": {"steps": 1, "seq_len": 32}})
        assert status == 507 and "storage is full" in body["detail"], body
        answer = health(service)
        assert answer.status_code == 503 and answer.json()["storage"] == "full", answer.text
    finally:
        stop_service(service)


def test_a_full_data_dir_is_degraded_health_and_the_running_job_ends(tmp_path, model_cache,
                                                                      tmpfs):
    """The database, the embedded Redis and the storage all on one disk, filled mid-job."""
    root = tmp_path / "service"
    data = tmpfs(root / "data", "48m")
    service = start_service(root, model_cache, {"MEBP_HEARTBEAT_TIMEOUT_S": "4",
                                                "MEBP_RECONCILE_INTERVAL_S": "0.5"})
    try:
        assert health(service).status_code == 200
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, 100_000))[1]
        service.wait_for(job["id"], lambda j: j["progress"]["step"] >= 2, timeout_s=90)
        filler = fill(data)
        answer = health(service)
        assert answer.status_code == 503 and answer.json()["storage"] == "full", answer.text
        done = service.finished(job["id"], timeout_s=90)  # not left running
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "storage_full", done["error"]
        assert health(service).status_code == 503
        filler.unlink()
        assert health(service).status_code == 200
    finally:
        stop_service(service)


def test_a_job_started_with_200_kb_free_ends_storage_full_and_a_full_disk_submit_is_a_507(
        tmp_path, model_cache, tmpfs):
    """The database, Redis and the storage on one disk: a job taken with no room to record
    its end, were it to fill the disk (no reserve held), does not start; it was left running
    for good. With no byte left, a submit is a 507 (it was a 503); reads still answer."""
    root = tmp_path / "service"
    data = tmpfs(root / "data", "48m")
    service = start_service(root, model_cache, {})
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        leave_free(fill(data), 200 << 10)
        status, job = service.request("POST", "/v1/jobs", tiny_job(dataset, 50))
        assert status == 201, job
        done = service.finished(job["id"], timeout_s=60)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "storage_full", done["error"]
        assert "the job was not started" in done["error"]["message"], done["error"]
        assert done["adapter"] is None
        job_dir = data / "storage" / "jobs" / job["id"]
        assert not job_dir.exists() or not list(job_dir.iterdir())
        filler = fill(data)
        status, body = service.request("POST", "/v1/jobs", tiny_job(dataset, 1))
        assert status == 507 and body == {"detail": DATABASE_DISK_FULL}, body
        assert service.client.get(f"/v1/jobs/{job['id']}").status_code == 200
        filler.unlink()  # the worker goes on once there is room
        status, after = service.request("POST", "/v1/jobs", tiny_job(dataset, 1))
        assert status == 201, after
        assert service.finished(after["id"], timeout_s=90)["status"] == "succeeded"
    finally:
        stop_service(service)


@contextmanager
def postgres_on_small_disk(size: str) -> Iterator[tuple[str, Path]]:
    """A fresh PostgreSQL database whose tablespace is a tmpfs of ``size`` (owned by the
    server's user, at a path it can reach): its URL and the mount."""
    server = pwd.getpwnam("postgres")
    mount = Path(tempfile.mkdtemp(prefix="mebp-pg-disk-"))
    mount.chmod(0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700,uid={server.pw_uid},"
                    f"gid={server.pw_gid}", "tmpfs", str(mount)], check=True)
    name = f"mebp_test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f"create tablespace {name} location '{mount}'")
            admin.execute(f'create database "{name}" tablespace {name}')
        try:
            yield POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + name, mount
        finally:
            with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
                admin.execute(f'drop database "{name}" with (force)')
                admin.execute(f"drop tablespace {name}")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
        mount.rmdir()


@pytest.fixture(params=["embedded", "shared"])
def api_on_small_disk(request, tmp_path, model_cache, model_root, tmpfs):
    """The fast tier with its database on a small tmpfs: SQLite in a data dir on it, or a
    PostgreSQL database in a tablespace on it; yields the service and the mount."""
    if request.param == "embedded":
        disk = tmpfs(tmp_path / "api", "8m")
        with in_process_service(disk, model_cache, model_root) as api:
            yield api, disk
    else:
        with postgres_on_small_disk("24m") as (url, disk), in_process_service(
                tmp_path / "api", model_cache, model_root, url) as api:
            yield api, disk


def test_a_submit_the_database_has_no_room_for_is_a_507_on_either_database(api_on_small_disk):
    api, disk = api_on_small_disk
    status, dataset = api.upload("rows.jsonl", ROWS)
    assert status == 201, dataset
    filler = fill(disk)
    try:
        status, body = api.request("POST", "/v1/jobs", tiny_job(dataset["id"], 1))
        assert status == 507 and body == {"detail": DATABASE_DISK_FULL}, body
        assert api.request("GET", "/v1/jobs")[1]["count"] == 0  # nothing half-written
    finally:
        filler.unlink()
    status, job = api.request("POST", "/v1/jobs", tiny_job(dataset["id"], 1))
    assert status == 201, job  # the room came back: so did the database
    if job["status"] not in TERMINAL:
        api.request("POST", f"/v1/jobs/{job['id']}/cancel")
