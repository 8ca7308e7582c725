"""Fairness between tenants (issue 12, item 8): one tenant's day-long job and its backlog held
the FIFO queue while every later job waited, and nothing bounded a tenant's queued or
running jobs. Now a free worker takes the fairest tenant's job, a tenant runs at most
MEBP_MAX_RUNNING_JOBS_PER_TENANT jobs at once, and past MEBP_MAX_QUEUED_JOBS_PER_TENANT
queued jobs a submission is a 429."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime

import httpx
import pytest
from service_harness import (
    REDIS_TEST_URL,
    create_key,
    start_service,
    stop_service,
    temporary_postgres_database,
    tiny_job,
)
from sqlmodel import Session

from app.keys import create_key as create_key_in
from service.db import make_engine

ROWS = b"".join(json.dumps({"text": f"fair row {i}"}).encode() + b"\n" for i in range(8))
LIMITS = {"MEBP_MAX_RUNNING_JOBS_PER_TENANT": "1", "MEBP_MAX_QUEUED_JOBS_PER_TENANT": "2",
          "MEBP_RECONCILE_INTERVAL_S": "0.5"}



def submit(client: httpx.Client, dataset: str, steps: int) -> str:
    response = client.post("/v1/jobs", json=tiny_job(dataset, steps, seq_len=16))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def tenant_client(service, key: str) -> tuple[httpx.Client, str]:
    """A client for another tenant, and the dataset it uploaded."""
    client = httpx.Client(base_url=service.url, timeout=120,
                          headers={"Authorization": f"Bearer {key}"})
    upload = client.post("/v1/datasets", files={"file": ("b.jsonl", ROWS)})
    assert upload.status_code == 201, upload.text
    return client, upload.json()["id"]


def span(job: dict) -> tuple[datetime, datetime]:
    return (datetime.fromisoformat(job["started_at"]),
            datetime.fromisoformat(job["finished_at"]))


def test_a_tenants_backlog_waits_behind_another_tenants_job_and_its_queue_is_bounded(
        tmp_path, model_cache):
    service = start_service(tmp_path, model_cache, LIMITS)  # one worker
    other, other_dataset = tenant_client(service, create_key(service, "tenant-b"))
    try:
        dataset = service.upload("a.jsonl", ROWS)[1]["id"]
        long_job = submit(service.client, dataset, 100_000)
        service.wait_for(long_job, lambda j: j["progress"]["step"] >= 1, timeout_s=60)
        backlog = [submit(service.client, dataset, 2) for _ in range(2)]
        # a third queued job, or a fleet, passes the tenant's queue limit
        refused = service.client.post("/v1/jobs", json=tiny_job(dataset, 2, seq_len=16))
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) > 0
        assert "MEBP_MAX_QUEUED_JOBS_PER_TENANT" in refused.json()["detail"]
        assert "limit of 2" in refused.json()["detail"]
        fleet = service.client.post("/v1/fleets", json={
            "model": "preset:tiny", "training_file": dataset, "devices": ["pixel-8"]})
        assert fleet.status_code == 429, fleet.text
        # the other tenant's queue is its own
        late = submit(other, other_dataset, 2)
        service.request("POST", f"/v1/jobs/{long_job}/cancel")
        jobs = {job_id: service.finished(job_id, timeout_s=120)
                for job_id in [long_job, *backlog]}
        jobs[late] = service.finished(late, timeout_s=120, client=other)
        assert jobs[late]["status"] == "succeeded", jobs[late]
        assert all(jobs[job_id]["status"] == "succeeded" for job_id in backlog), jobs
        # submitted after the whole backlog, it ran next: before the backlog's first job
        assert span(jobs[late])[0] < span(jobs[backlog[0]])[0], jobs
        assert [span(jobs[job_id])[0] for job_id in backlog] == \
            sorted(span(jobs[job_id])[0] for job_id in backlog)  # FIFO within a tenant
    finally:
        other.close()
        stop_service(service)


def test_two_workers_never_run_two_jobs_of_a_tenant_at_its_limit_of_one(tmp_path,
                                                                        model_cache):
    with temporary_postgres_database() as database:
        service = start_service(tmp_path, model_cache, {
            **LIMITS, "DATABASE_URL": database, "REDIS_URL": REDIS_TEST_URL,
            "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}"}, workers=2)
        engine = make_engine(database)  # migrated by the service as it started
        with Session(engine) as session:
            key = create_key_in(session, tenant="tenant-b")
        engine.dispose()
        other, other_dataset = tenant_client(service, key)
        try:
            dataset = service.upload("a.jsonl", ROWS)[1]["id"]
            long_job = submit(service.client, dataset, 100_000)
            service.wait_for(long_job, lambda j: j["progress"]["step"] >= 1, timeout_s=60)
            mine = [submit(service.client, dataset, 2) for _ in range(2)]
            # the other tenant's job runs on the free worker while the long job holds the other
            theirs = service.finished(submit(other, other_dataset, 2), timeout_s=120,
                                      client=other)
            assert theirs["status"] == "succeeded", theirs
            states = {job_id: service.request("GET", f"/v1/jobs/{job_id}")[1]["status"]
                      for job_id in [long_job, *mine]}
            assert states == {long_job: "running", mine[0]: "queued", mine[1]: "queued"}
            service.request("POST", f"/v1/jobs/{long_job}/cancel")
            # its waiting jobs then run, though the other tenant's claims took their messages
            jobs = {job_id: service.finished(job_id, timeout_s=120)
                    for job_id in [long_job, *mine]}
            assert all(jobs[job_id]["status"] == "succeeded" for job_id in mine), jobs
            spans = sorted(span(job) for job in jobs.values())
            assert all(end <= start for (_, end), (start, _) in
                       zip(spans, spans[1:], strict=False)), spans  # one at a time
        finally:
            other.close()
            stop_service(service)


@pytest.mark.parametrize("deployment", ["embedded", "shared"])
def test_concurrent_submissions_never_pass_the_queued_limit(tmp_path, model_cache, deployment):
    """Twelve submissions at once against a limit of 3 (no worker, so all stay queued): the
    count after the insert, taken in turn per tenant, lets exactly 3 in."""
    with ExitStack() as stack:
        env = {"MEBP_MAX_QUEUED_JOBS_PER_TENANT": "3"}
        if deployment == "shared":
            env |= {"DATABASE_URL": stack.enter_context(temporary_postgres_database()),
                    "REDIS_URL": REDIS_TEST_URL,
                    "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}"}
        service = start_service(tmp_path, model_cache, env, workers=0)
        stack.callback(stop_service, service)
        dataset = service.upload("a.jsonl", ROWS)[1]["id"]
        with ThreadPoolExecutor(12) as pool:
            body = tiny_job(dataset, 2, seq_len=16)
            statuses = list(pool.map(
                lambda _: service.client.post("/v1/jobs", json=body).status_code, range(12)))
        assert sorted(statuses) == [201] * 3 + [429] * 9, statuses
        queued = service.client.get("/v1/jobs", params={"status": "queued"}).json()
        assert queued["count"] == 3
