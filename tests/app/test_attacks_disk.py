"""A full disk, made real with small tmpfs mounts under a real ``mebp serve``: an upload is a
507 that leaves nothing, a job ends ``failed`` with ``storage_full`` wherever the disk filled
(before the engine started, or under the database and Redis too), and health says so."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import httpx
import pytest
from service_harness import start_service, stop_service, tiny_job

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
