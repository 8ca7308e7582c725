"""Worker faults, each made real by killing processes the test started itself: a worker
killed mid-job (alone, too often, and in a fleet's round with dropouts, stragglers and an
out-of-memory device). The services' faults are in test_faults_services."""

from __future__ import annotations

import json
import time

import pytest
import torch
from held_engines import hold_engine, release, storage_of
from service_harness import (
    FAST_RECOVERY,
    kill_group,
    start_service,
    start_worker,
    stop_service,
    tiny_job,
)

from mebp_core.federated.rounds import fate
from worker.memory_cap import GROUP_PARENT, v1_hierarchy, v2_hierarchy

ROWS = b"".join(json.dumps({"text": f"fault row {i}"}).encode() + b"\n" for i in range(16))



@pytest.fixture
def embedded_with_external_workers(tmp_path, model_cache):
    """`mebp serve` with no worker of its own: the test runs (and kills) the workers."""
    def start(**extra_env):
        service = start_service(tmp_path, model_cache, {**FAST_RECOVERY, **extra_env},
                                workers=0)
        started.append(service)
        env = {**FAST_RECOVERY, **extra_env,
               "REDIS_URL": f"unix://{tmp_path / 'data' / 'redis.socket'}"}
        return service, lambda: workers.append(
            start_worker(tmp_path / "data", model_cache, env)) or workers[-1]
    started, workers = [], []
    yield start
    for worker in workers:
        if worker.poll() is None:
            kill_group(worker)
    for service in started:
        stop_service(service)


def test_a_worker_killed_mid_job_is_requeued_and_resumes_from_its_checkpoint(
        embedded_with_external_workers):
    service, new_worker = embedded_with_external_workers()
    first = new_worker()
    dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
    job = service.request("POST", "/v1/jobs", tiny_job(dataset, 40, checkpoint_every=5))[1]
    engine = hold_engine(storage_of(service), job["id"], 12)
    kill_group(first)  # the worker and the horse running the job; the engine dies with its horse
    release(engine)
    new_worker()
    done = service.finished(job["id"], timeout_s=120)
    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    messages = [event["message"] for event in service.job_events(job["id"])]
    assert any(m.startswith("re-queued: its worker") for m in messages), messages
    resumed = [m for m in messages if m.startswith("resuming from the checkpoint at step")]
    assert len(resumed) == 1 and int(resumed[0].rsplit(" ", 1)[1]) >= 10
    steps = [m["step"] for m in service.request("GET", f"/v1/jobs/{job['id']}/metrics")[1]["data"]]
    assert steps == list(range(1, 41))  # every step once: none lost, none twice
    for hierarchy in filter(None, (v2_hierarchy(), v1_hierarchy())):
        assert not list((hierarchy / GROUP_PARENT).glob(f"{job['id']}-a*"))


def test_a_job_whose_worker_is_lost_too_often_fails_worker_lost(
        embedded_with_external_workers):
    service, new_worker = embedded_with_external_workers(MEBP_MAX_ATTEMPTS="1")
    worker = new_worker()
    dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
    job = service.request("POST", "/v1/jobs", tiny_job(dataset, 100_000))[1]
    service.wait_for(job["id"], lambda j: j["progress"]["step"] >= 2, timeout_s=60)
    kill_group(worker)
    done = service.finished(job["id"], timeout_s=60)
    assert done["status"] == "failed" and done["error"]["code"] == "worker_lost", done
    assert "no heartbeat" in done["error"]["message"]


ROUND_SEED, DROPOUT, LOCAL_STEPS = 35, 0.4, 40  # seed 35: device 1 alone goes offline


def test_an_unreliable_fleet_round_survives_a_killed_worker_and_leaves_out_who_failed(
        embedded_with_external_workers):
    """One federated round of five phones: two train (one of them on a worker SIGKILLed
    mid-job, which resumes elsewhere), one goes offline mid-round, one is a straggler past
    the deadline and one is out of memory under its cap. The global adapter averages the two
    that trained, each once."""
    service, new_worker = embedded_with_external_workers()
    first = new_worker()
    for device in ({"id": "slow-phone", "budget_mb": 1024, "relative_compute": 0.0001},
                   {"id": "small-phone", "budget_mb": 64, "relative_compute": 1.0}):
        assert service.request("POST", "/v1/devices", {**device, "name": device["id"]})[0] == 201
    hyper = {"steps": LOCAL_STEPS, "seq_len": 32, "checkpoint_every": 5}
    plan = service.request("POST", "/v1/plans", {"model": "preset:tiny", "device": "pixel-8",
                                                 "seq_len": 32})[1]
    slowest_s = max(c["device_step_time_s_estimate"] for c in plan["configurations"])
    deadline_s = 10 * slowest_s * LOCAL_STEPS  # every pixel-8 makes it, the slow phone not
    rows = b"".join(json.dumps({"text": f"fleet row {i} of the unreliable round"}).encode()
                    + b"\n" for i in range(23))
    training = service.upload("rows.jsonl", rows)[1]["id"]
    status, fleet = service.request("POST", "/v1/fleets", {
        "model": "preset:tiny", "training_file": training, "validation_file": training,
        "devices": ["pixel-8", "pixel-8", "pixel-8", "slow-phone", "small-phone"],
        "hyperparameters": hyper, "aggregation": "fedavg", "rounds": 1, "seed": ROUND_SEED,
        "dropout": DROPOUT, "deadline_s": deadline_s, "allow_infeasible": True})
    assert status == 201, fleet
    assert fleet["members"][3]["device_step_time_s_estimate"] * LOCAL_STEPS > deadline_s
    offline = [fate(ROUND_SEED, 0, member, DROPOUT, LOCAL_STEPS).offline_after_step
               for member in range(5)]
    assert offline[0] is offline[2] is None and 0 < offline[1] < LOCAL_STEPS, offline

    doomed = fleet["rounds"][0]["participants"][0]["job_id"]
    engine = hold_engine(storage_of(service), doomed, 8)
    kill_group(first)  # the worker and the horse running device 0's job; its engine with them
    release(engine)
    new_worker()
    deadline = time.monotonic() + 300
    while (current := service.request("GET", f"/v1/fleets/{fleet['id']}")[1]["rounds"][0]
           )["status"] == "running":
        assert time.monotonic() < deadline, (current, service.output.read_text()[-3000:])
        time.sleep(0.5)

    seats = current["participants"]
    assert current["status"] == "done", current
    assert [seat["outcome"] for seat in seats] == ["trained", "dropped", "trained", "straggler",
                                                   "out_of_memory"], seats
    assert seats[3]["job_id"] is None  # a straggler is never run
    resumed = service.request("GET", f"/v1/jobs/{doomed}")[1]
    assert resumed["attempts"] == 2, resumed
    steps = [m["step"] for m in service.request("GET", f"/v1/jobs/{doomed}/metrics")[1]["data"]]
    assert steps == list(range(1, LOCAL_STEPS + 1))
    assert service.request("GET", f"/v1/jobs/{seats[1]['job_id']}")[1]["progress"][
        "total_steps"] == offline[1]
    small = service.request("GET", f"/v1/jobs/{seats[4]['job_id']}")[1]
    assert small["error"]["code"] == "memory_budget_exceeded", small
    assert current["simulated_wall_s"] == max(seats[i]["device_time_s"] for i in (0, 2))

    trained = [(service.adapter_tensors(f"/v1/jobs/{seats[i]['job_id']}/adapter"),
                seats[i]["examples"]) for i in (0, 2)]
    total = sum(examples for _, examples in trained)
    combined = service.adapter_tensors(f"/v1/fleets/{fleet['id']}/rounds/0/adapter")
    for name, tensor in combined.items():
        expected = sum(update[name].double() * n / total for update, n in trained)
        torch.testing.assert_close(tensor, expected.float(), rtol=1e-6, atol=1e-7)
