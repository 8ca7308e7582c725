"""Ready means ready: `mebp serve` on a host with no calibration is `starting` (health 503,
`"calibration": "measuring"`) until this host's calibration is on disk, and a request that
needs a plan meanwhile is a 503 with Retry-After at once, never a wait on the measurement.
Two services starting together share the one measurement. Once ready, a job is planned from
that calibration without measuring again. An unsteady calibration is used with its plans
marked provisional."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from datetime import UTC, datetime

import httpx
from service_harness import poll_until, start_service, stop_service, tiny_job

from mebp_core.atomic import exclusive_lock, write_json_atomically
from mebp_core.plan.calibration import MAX_SPREAD, calibration_path

ROWS = b"".join(json.dumps({"text": f"gate row {i}"}).encode() + b"\n" for i in range(8))
# a request that waits on the measurement would still be waiting when this runs out
PROMPT_ANSWER_S = 20


def health(service) -> httpx.Response:
    return httpx.get(service.url + "/v1/health", timeout=10)


def test_services_start_measuring_refuse_plans_at_once_then_plan_from_the_shared_calibration(
        tmp_path, host):
    cache = tmp_path / "cache"  # a new host: nothing measured
    threads = os.cpu_count() or 1  # what the API plans at
    path = calibration_path(cache, threads)
    path.parent.mkdir(parents=True)
    services = []
    # another process on this host is measuring: both services wait for it, not measure
    with exclusive_lock(path.with_suffix(".lock")):
        try:
            for name in ("first", "second"):
                services.append(start_service(tmp_path / name, cache, {}, workers=0,
                                              ready=False))
            for service in services:
                answer = health(service)
                assert answer.status_code == 503, answer.text
                assert answer.json()["status"] == "starting"
                assert answer.json()["calibration"] == "measuring"
                client = service.client
                dataset = client.post("/v1/datasets", files={"file": ("d.jsonl", ROWS)})
                assert dataset.status_code == 201, dataset.text  # needs no plan
                refused = client.post("/v1/jobs", json=tiny_job(dataset.json()["id"], 3),
                                      timeout=PROMPT_ANSWER_S)
                assert refused.status_code == 503, refused.text
                assert refused.headers["Retry-After"].isdigit()
                assert "calibration is being measured" in refused.json()["detail"]
                plan = client.get("/v1/plans", params={"model": "preset:tiny",
                                                       "device": "pixel-8"},
                                  timeout=PROMPT_ANSWER_S)
                assert plan.status_code == 503, plan.text
            measured_at = datetime.now(UTC).isoformat(timespec="seconds")
            write_json_atomically(path, asdict(replace(host, threads=threads,
                                                       measured_at=measured_at)))
        except BaseException:
            for service in services:
                stop_service(service)
            raise
    try:
        for service in services:
            ready = poll_until(lambda s=service: health(s), lambda a: a.status_code == 200,
                               60, lambda a: f"never ready: {a.text}")
            assert ready.json()["calibration"] == "ready"
            client = service.client
            dataset = client.post("/v1/datasets", files={"file": ("d.jsonl", ROWS)}).json()
            job = client.post("/v1/jobs", json=tiny_job(dataset["id"], 3),
                              timeout=PROMPT_ANSWER_S)
            assert job.status_code == 201, job.text
            # planned from the calibration the other process wrote, not a new measurement
            calibration = job.json()["plan"]["calibration"]
            assert calibration["measured_at"] == measured_at and calibration["steady"]
            # its gate, given the lock, read what the other process wrote
            poll_until(service.output.read_text, lambda log: "calibration took" in log, 60,
                       lambda log: f"never said ready: {log[-2000:]}")
    finally:
        for service in services:
            stop_service(service)


def test_an_unsteady_calibration_is_used_with_its_plans_marked_provisional(tmp_path, host):
    cache = tmp_path / "cache"
    threads = os.cpu_count() or 1
    path = calibration_path(cache, threads)
    path.parent.mkdir(parents=True)
    # repeats 80x apart, as on a host busy with other work; measured just now, so not due
    # to be measured again during the test
    unsteady = replace(host, threads=threads, spread={"matmul": 80.0, "decompress": 1.2},
                       measured_at=datetime.now(UTC).isoformat(timespec="seconds"))
    path.write_text(json.dumps(asdict(unsteady)))
    service = start_service(tmp_path / "service", cache, {}, workers=0)
    try:
        answer = health(service)
        assert answer.status_code == 200 and answer.json()["calibration"] == "provisional"
        plan = service.client.get("/v1/plans", params={"model": "preset:tiny",
                                                       "device": "pixel-8"})
        assert plan.status_code == 200, plan.text
        calibration = plan.json()["calibration"]
        assert calibration["steady"] is False
        assert calibration["max_spread"] == 80.0 > calibration["spread_bound"] == MAX_SPREAD
    finally:
        stop_service(service)


def test_an_unreadable_calibration_is_a_failed_health_and_a_503_naming_it(tmp_path):
    cache = tmp_path / "cache"
    path = calibration_path(cache, os.cpu_count() or 1)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    service = start_service(tmp_path / "service", cache, {}, workers=0, ready=False)
    try:
        answer = poll_until(lambda: health(service),
                            lambda a: a.json().get("calibration") == "failed", 60,
                            lambda a: f"never failed: {a.text}")
        assert answer.status_code == 503 and answer.json()["status"] == "degraded"
        plan = service.client.get("/v1/plans", params={"model": "preset:tiny",
                                                       "device": "pixel-8"})
        assert plan.status_code == 503, plan.text  # not a 500
        assert "unreadable calibration" in plan.json()["detail"]
        assert str(path) in plan.json()["detail"]
    finally:
        stop_service(service)
