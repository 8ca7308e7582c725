"""Tenants: keys made by `mebp keys create` are stored hashed; each tenant sees only its own
datasets, jobs, adapters and fleets, and another tenant's ids answer 404."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys

import pytest
from service_harness import create_key

ROWS = b'{"text": "tenant rows are their own"}\n' * 4


@pytest.fixture(scope="module")
def other(api):
    """A client for another tenant, acme."""
    key = create_key(api, "acme")
    client = api.anonymous()
    client.headers["Authorization"] = f"Bearer {key}"
    yield key, client
    client.close()


@pytest.fixture(scope="module")
def default_job(api):
    """A job of the default tenant (queued: the fast tier runs no worker)."""
    dataset = api.upload("mine.jsonl", ROWS)[1]["id"]
    status, job = api.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": dataset, "device": "pixel-8",
        "hyperparameters": {"steps": 1, "seq_len": 16}})
    assert status == 201, job
    return job


def test_keys_are_stored_only_as_their_hash(api, other):
    key, _ = other
    database = sqlite3.connect(api.output.parent / "data" / "mebp.db")
    rows = database.execute("select tenant, key_hash, scopes from api_keys").fetchall()
    database.close()
    assert ("acme", hashlib.sha256(key.encode()).hexdigest(), "user") in rows
    assert not any(key in " ".join(map(str, row)) for row in rows)
    assert not any(api.api_key in " ".join(map(str, row)) for row in rows)


def test_another_tenants_ids_answer_404(other, default_job):
    _, client = other
    job_id, dataset_id = default_job["id"], default_job["training_file"]
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/metrics",
                 f"/v1/jobs/{job_id}/adapter", f"/v1/datasets/{dataset_id}"):
        assert client.get(path).status_code == 404, path
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 404
    assert client.get("/v1/jobs").json()["count"] == 0
    assert client.get("/v1/datasets").json()["count"] == 0
    assert client.get("/v1/fleets").json()["count"] == 0
    # nor can it train on them
    response = client.post("/v1/jobs", json={"model": "preset:tiny", "device": "pixel-8",
                                             "training_file": dataset_id})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "training_file"]


def test_each_tenant_sees_its_own(api, other, default_job):
    _, client = other
    upload = client.post("/v1/datasets", files={"file": ("acme.jsonl", ROWS)})
    assert upload.status_code == 201
    job = client.post("/v1/jobs", json={"model": "preset:tiny", "device": "pixel-8",
                                        "training_file": upload.json()["id"],
                                        "hyperparameters": {"steps": 1, "seq_len": 16}})
    assert job.status_code == 201, job.text
    mine = {j["id"] for j in client.get("/v1/jobs").json()["data"]}
    assert mine == {job.json()["id"]}
    theirs = {j["id"] for j in api.request("GET", "/v1/jobs")[1]["data"]}
    assert job.json()["id"] not in theirs and default_job["id"] in theirs


def test_without_a_known_key_every_route_is_401(api):
    for key in (None, "mebp-never-issued-0000000000"):
        headers = {"Authorization": "" if key is None else f"Bearer {key}"}
        for path in ("/v1/jobs", "/v1/datasets", "/v1/fleets", "/v1/devices"):
            assert api.client.get(path, headers=headers).status_code == 401


def test_a_tenant_name_is_checked(api):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "keys", "create", "--tenant",
                           "../Evil Corp", "--data-dir", str(api.output.parent / "data")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "--tenant" in done.stderr


def test_a_revoked_key_is_a_401_from_then_on(api):
    key = create_key(api, "gamma")
    headers = {"Authorization": f"Bearer {key}"}
    assert api.client.get("/v1/jobs", headers=headers).status_code == 200
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "keys", "revoke", "--key", key,
                           "--data-dir", str(api.output.parent / "data")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and "revoked 1 key" in done.stderr, done.stderr
    assert api.client.get("/v1/jobs", headers=headers).status_code == 401
