"""A worker starts each job's engine before the job: the job's cap is set on an engine that
its worker forked from a zygote that had imported torch (``worker.warm_engine``,
``worker.engine_zygote``)."""

from __future__ import annotations

import json

from service_harness import HANG_GUARD_S, tiny_job

ROWS = b"".join(json.dumps({"text": f"warm row {i}"}).encode() + b"\n" for i in range(8))


def test_each_job_runs_in_an_engine_its_worker_started_before_the_job(service):
    dataset = service.upload("warm.jsonl", ROWS)[1]["id"]
    for _ in range(2):  # the worker's first engine, then the one started beside a job
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, 2))[1]
        done = service.finished(job["id"], timeout_s=HANG_GUARD_S)
        assert done["status"] == "succeeded", done
        capped = [event["data"] for event in service.job_events(job["id"])
                  if event["message"].startswith("engine running under")]
        assert len(capped) == 1 and capped[0]["engine_started_ahead"] is True, capped
        assert capped[0]["engine_forked"] is True, capped  # from the worker's zygote
