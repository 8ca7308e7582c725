"""Bad input to the service: each refusal is a 4xx naming the file, line or field, and
leaves nothing behind. In process (the fast tier), but for a job that must run to fail."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest

GOOD = b'{"text": "hello there"}\n'


def test_a_malformed_dataset_is_refused_naming_its_line(api):
    status, body = api.upload("chat.jsonl", GOOD + b'{"text": "ok"}\n{"text": 3}\n')
    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "file"]
    assert body["detail"][0]["msg"] == 'chat.jsonl:3: "text" must be a string, got an integer'
    status, body = api.upload("broken.jsonl", GOOD + b'{"text": "unterminated\n')
    assert status == 422 and body["detail"][0]["msg"].startswith("broken.jsonl:2: invalid JSON")
    assert api.upload("empty.jsonl", b"\n\n")[0] == 422


def test_an_oversized_upload_is_refused_and_not_kept(api):
    before = api.request("GET", "/v1/datasets")[1]["count"]
    status, body = api.upload("big.jsonl", GOOD * (api.max_upload_bytes // len(GOOD) + 10))
    assert status == 413 and "upload limit" in body["detail"]
    assert api.request("GET", "/v1/datasets")[1]["count"] == before
    datasets = api.output.parent / "data" / "storage" / "datasets"
    assert all(not path.name.startswith(".") for path in datasets.iterdir())


@pytest.fixture(scope="module")
def dataset_id(api) -> str:
    return api.upload("train.jsonl", GOOD * 4)[1]["id"]


@pytest.mark.parametrize("change, loc", [
    ({"device": "nokia-3310"}, ["body", "device"]),
    ({"model": "preset:gpt-17"}, ["body", "model"]),
    ({"model": "/etc"}, ["body", "model"]),
    ({"training_file": "ds-missing"}, ["body", "training_file"]),
    ({"validation_file": "ds-missing"}, ["body", "validation_file"]),
    ({"hyperparameters": {"lora_rank": 0}}, ["body", "hyperparameters", "lora_rank"]),
    ({"hyperparameters": {"lorarank": 4}}, ["body", "hyperparameters", "lorarank"]),
    ({"hyperparameters": {"learning_rate": 11}}, ["body", "hyperparameters", "learning_rate"]),
    ({"hyperparameters": {"lr": 0.1}}, ["body", "hyperparameters", "lr"]),  # the CLI's name
    ({"hyperparameters": {"seq_len": 1 << 17}}, ["body", "hyperparameters", "seq_len"]),
    ({"method": "mezo", "hyperparameters": {"optimizer": "adamw"}}, ["body", "hyperparameters"]),
    ({"config": {"checkpoint_blocks": 0}}, ["body", "config"]),
    ({"device": None, "memory_budget_mb": None}, ["body", "memory_budget_mb"]),
    ({"memory_budget_mb": -5}, ["body", "memory_budget_mb"]),
])
def test_an_invalid_job_field_is_named_in_a_422(api, dataset_id, change, loc):
    body = {"model": "preset:tiny", "training_file": dataset_id, "device": "pixel-8", **change}
    before = api.request("GET", "/v1/jobs")[1]["count"]
    status, error = api.request("POST", "/v1/jobs", body)
    assert status == 422, error
    assert error["detail"][0]["loc"][:len(loc)] == loc, error
    assert api.request("GET", "/v1/jobs")[1]["count"] == before


def test_unknown_ids_are_404s(api):
    for path in ("/v1/jobs/job-nope", "/v1/jobs/job-nope/events", "/v1/jobs/job-nope/metrics",
                 "/v1/jobs/job-nope/adapter", "/v1/datasets/ds-nope"):
        status, body = api.request("GET", path)
        assert status == 404 and "nope" in body["detail"], path
    assert api.request("POST", "/v1/jobs/job-nope/cancel")[0] == 404


def test_tokens_outside_the_vocabulary_fail_the_job_naming_dataset_and_line(service):
    rows = GOOD + json.dumps({"input_ids": [1, 2, 10_000_000]}).encode() + b"\n"
    status, dataset = service.upload("tokens.jsonl", rows)
    assert status == 201  # its shape is fine; the vocabulary is the model's
    status, job = service.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": dataset["id"], "device": "pixel-8",
        "hyperparameters": {"steps": 1, "seq_len": 32}})
    assert status == 201, job
    job = service.finished(job["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "invalid_input"
    assert f"dataset {dataset['id']}:2:" in job["error"]["message"]
    assert "outside the vocabulary" in job["error"]["message"]


def test_gzip_uploads_are_unpacked_and_a_compression_bomb_stops_at_the_limit(api):
    rows = GOOD * 8
    status, dataset = api.upload("rows.jsonl.gz", gzip.compress(rows))
    assert status == 201 and dataset["rows"] == 8
    assert dataset["sha256"] == hashlib.sha256(rows).hexdigest()
    bomb = gzip.compress(b"\n" * (64 * api.max_upload_bytes))  # ~16 MB from ~16 KB
    assert len(bomb) < api.max_upload_bytes // 8
    status, body = api.upload("bomb.jsonl.gz", bomb)
    assert status == 413 and "decompressed" in body["detail"]
    status, body = api.upload("broken.jsonl.gz", gzip.compress(rows)[:-12])
    assert status == 422 and "broken.jsonl.gz" in body["detail"][0]["msg"]


def test_rows_and_line_length_are_bounded(api):
    status, body = api.upload("many.jsonl", b'{"text": "x"}\n' * 1001)
    assert status == 422
    assert body["detail"][0]["msg"] == "many.jsonl:1001: more than the limit of 1000 rows"
    long_line = json.dumps({"text": "y" * 5000}).encode() + b"\n"
    status, body = api.upload("long.jsonl", GOOD + long_line)
    assert status == 422 and body["detail"][0]["msg"].startswith("long.jsonl:2: the line is")


def test_artifact_names_are_generated_never_taken_from_the_upload(api):
    status, dataset = api.upload("../../../etc/evil name.jsonl", GOOD)
    assert status == 201 and dataset["filename"] == "evil name.jsonl"
    stored = api.output.parent / "data" / "storage" / "datasets" / f"{dataset['id']}.jsonl"
    assert stored.read_bytes() == GOOD


def test_a_repeated_idempotency_key_returns_the_same_job(api, dataset_id):
    body = {"model": "preset:tiny", "training_file": dataset_id, "device": "pixel-8",
            "hyperparameters": {"steps": 1, "seq_len": 16}}
    headers = {"Idempotency-Key": "retry-0001"}
    first = api.client.post("/v1/jobs", json=body, headers=headers)
    again = api.client.post("/v1/jobs", json=body, headers=headers)
    other = api.client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "retry-0002"})
    assert first.status_code == 201 and again.status_code == 200 and other.status_code == 201
    assert again.json()["id"] == first.json()["id"] != other.json()["id"]
    jobs = api.request("GET", "/v1/jobs")[1]["data"]
    assert sum(job["id"] == first.json()["id"] for job in jobs) == 1


def test_the_public_learning_rate_is_the_configs_lr(api, dataset_id):
    status, job = api.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": dataset_id, "device": "pixel-8",
        "hyperparameters": {"steps": 1, "seq_len": 16, "learning_rate": 0.0421}})
    assert status == 201, job
    assert job["config"]["lr"] == 0.0421
