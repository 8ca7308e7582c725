"""An ``Idempotency-Key`` is bound to the request it was first sent with, on SQLite and on
PostgreSQL: the same body again (in any key order or spacing) answers the first job, another
body under that key is a 409 naming it, whether it comes after the first request or races it
(in process, and against the real service)."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from service_harness import TERMINAL

ROWS = b'{"text": "one key, one request"}\n' * 4
RACING_KEYS = 6


def upload(service) -> str:
    status, body = service.upload("rows.jsonl", ROWS)
    assert status == 201, body
    return body["id"]


def job_body(dataset: str, steps: int = 1, **fields) -> dict:
    return {"model": "preset:tiny", "training_file": dataset, "device": "pixel-8",
            "hyperparameters": {"steps": steps, "seq_len": 16}, **fields}


def post(service, body: dict | str, key: str):
    text = body if isinstance(body, str) else json.dumps(body)
    return service.client.post("/v1/jobs", content=text.encode(), headers={
        "Content-Type": "application/json", "Idempotency-Key": key})


def mismatch(key: str) -> dict:
    return {"detail": f"Idempotency-Key {key!r} was used for a different request body; "
                      "use a new key"}


def cancel_all(service, job_ids) -> None:
    for job_id in job_ids:
        job = service.request("GET", f"/v1/jobs/{job_id}")[1]
        if job["status"] not in TERMINAL:
            service.request("POST", f"/v1/jobs/{job_id}/cancel")


@pytest.fixture
def dataset(any_api) -> str:
    return upload(any_api)


def test_a_key_reused_with_another_body_is_a_409_naming_it(any_api, dataset):
    key = f"idem-{uuid.uuid4().hex[:12]}"
    body = job_body(dataset)
    first = post(any_api, body, key)
    assert first.status_code == 201, first.text
    try:
        # the same request: keys in another order, other spacing, a default written out
        same = json.dumps({"method": "mebp", **dict(reversed(body.items()))}, indent=3)
        again = post(any_api, same, key)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
        for other in (job_body(dataset, steps=2), job_body(dataset, metadata={"run": "b"}),
                      job_body(dataset, seed=1)):
            answer = post(any_api, other, key)
            assert answer.status_code == 409 and answer.json() == mismatch(key), answer.text
        jobs = any_api.request("GET", "/v1/jobs?limit=1000")[1]["data"]
        assert [job["id"] for job in jobs if job["training_file"] == dataset] == \
            [first.json()["id"]]  # the refused requests made nothing
        assert post(any_api, job_body(dataset, steps=2), key + "-b").status_code == 201
    finally:
        jobs = any_api.request("GET", "/v1/jobs?limit=1000")[1]["data"]
        cancel_all(any_api, [job["id"] for job in jobs if job["training_file"] == dataset])


def test_racing_requests_with_one_key_and_two_bodies_make_one_job_and_a_409(any_service):
    """Both requests may miss the early lookup; the one that loses the insert must still
    compare bodies (the unique index's IntegrityError path)."""
    dataset = upload(any_service)
    keys = [f"race-{uuid.uuid4().hex[:12]}" for _ in range(RACING_KEYS)]
    tries = [(job_body(dataset, steps=steps), key) for key in keys for steps in (1, 2)]
    with ThreadPoolExecutor(len(tries)) as pool:
        answers = list(pool.map(lambda attempt: post(any_service, *attempt), tries))
    made = [answer.json()["id"] for answer in answers if answer.status_code == 201]
    try:
        for index, key in enumerate(keys):
            pair = answers[2 * index: 2 * index + 2]  # its two bodies' answers
            assert sorted(answer.status_code for answer in pair) == [201, 409], \
                [answer.text for answer in pair]
            assert next(a.json() for a in pair if a.status_code == 409) == mismatch(key)
        assert len(made) == RACING_KEYS
    finally:
        cancel_all(any_service, made)
