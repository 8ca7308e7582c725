"""`mebp worker` scales out: an API with no worker of its own, and two `mebp worker`
processes sharing its Redis, PostgreSQL and storage, run two jobs at once; as two "hosts"
(each its own data dir, cache and threads) they share a fleet's rounds, and a host killed
mid-round has its job resumed on the other."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from service_harness import (
    FAST_RECOVERY,
    HANG_GUARD_S,
    REDIS_TEST_URL,
    kill_group,
    poll_until,
    service_env,
    start_service,
    start_worker,
    stop_service,
    temporary_postgres_database,
)

from service.disk_space import RESERVE_NAME

ROWS = b"".join(json.dumps({"text": f"scale out {i}"}).encode() + b"\n" for i in range(8))
LONG_JOB = {"model": "preset:tiny", "device": "pixel-8",
            "hyperparameters": {"steps": 100_000, "seq_len": 32}}


def test_two_workers_on_a_shared_redis_and_database_run_jobs_side_by_side(tmp_path,
                                                                          model_cache):
    with temporary_postgres_database() as database:
        env = {"DATABASE_URL": database, "REDIS_URL": REDIS_TEST_URL,
               "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}",
               "MEBP_STORAGE_DIR": str(tmp_path / "shared-storage")}
        service = start_service(tmp_path / "api", model_cache, env, workers=0)
        workers = [subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--data-dir",
                                     str(tmp_path / f"worker-{i}")],
                                    env=service_env(model_cache, env))
                   for i in range(2)]
        try:
            dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
            jobs = [service.request("POST", "/v1/jobs", {**LONG_JOB, "training_file": dataset})
                    [1]["id"] for _ in range(2)]
            for job in jobs:
                service.wait_for(job, lambda j: j["progress"]["step"] >= 1, timeout_s=60)
            # both are running at once, each on its own worker
            states = [service.request("GET", f"/v1/jobs/{job}")[1]["status"] for job in jobs]
            assert states == ["running", "running"]
            started_on = {next(e["data"]["worker"] for e in
                               service.job_events(job)
                               if e["data"].get("status") == "running") for job in jobs}
            assert len(started_on) == 2
            for job in jobs:
                service.request("POST", f"/v1/jobs/{job}/cancel")
            for job in jobs:
                assert service.finished(job, timeout_s=30)["status"] == "cancelled"
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(timeout=30)
            stop_service(service)


@dataclass
class Host:
    worker: subprocess.Popen  # its `mebp worker`
    data_dir: Path
    cache: Path
    threads: int

    @property
    def name(self) -> str:
        """What the job rows call its worker."""
        return f"{socket.gethostname()}:{self.worker.pid}"


LOCAL_STEPS, CHECKPOINT_EVERY = 40, 4
FLEET_ROWS = b"".join(json.dumps({"text": f"host row {i} of the shared fleet"}).encode()
                      + b"\n" for i in range(24))


@pytest.fixture
def two_hosts(tmp_path, model_cache, seed_calibration):
    """One API with no worker, and a `mebp worker` on each of two "hosts": each its own data
    dir, cache (its own calibration, packed models) and threads; they share only PostgreSQL,
    Redis and the storage dir. Yields the service and the hosts; a lost worker's job is
    noticed within seconds."""
    cores = os.cpu_count() or 1
    with temporary_postgres_database() as database:
        shared = {"DATABASE_URL": database, "REDIS_URL": REDIS_TEST_URL,
                  "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}",
                  "MEBP_STORAGE_DIR": str(tmp_path / "shared-storage"), **FAST_RECOVERY}
        service = start_service(tmp_path / "api", model_cache, shared, workers=0)
        hosts = []
        for index, threads in enumerate((1, min(2, cores))):
            cache = seed_calibration(tmp_path / f"host-{index}" / "cache")
            for count in range(1, cores + 1):
                seed_calibration(cache, count, speed=count / cores)
            data_dir = tmp_path / f"host-{index}" / "data"
            worker = start_worker(data_dir, cache, {**shared, "MEBP_THREADS": str(threads)})
            hosts.append(Host(worker, data_dir, cache, threads))
        try:
            poll_until(lambda: service.client.get("/v1/health").json(),
                       lambda health: health["workers"] >= 2, HANG_GUARD_S,
                       lambda health: f"the two workers never listened: {health}")
            yield service, hosts
        finally:
            for host in hosts:
                if host.worker.poll() is None:
                    kill_group(host.worker)
            stop_service(service)


@pytest.mark.slow
def test_a_fleet_spreads_over_two_hosts_and_a_killed_host_s_job_resumes_on_the_other(
        two_hosts):
    service, hosts = two_hosts
    names = {host.name: host for host in hosts}
    training = service.upload("rows.jsonl", FLEET_ROWS)[1]["id"]
    status, fleet = service.request("POST", "/v1/fleets", {
        "model": "preset:tiny", "training_file": training,
        "simulated": {"device": "pixel-8", "count": 2}, "aggregation": "fedavg", "rounds": 1,
        "local_steps": LOCAL_STEPS, "seed": 3, "hyperparameters": {
            "steps": LOCAL_STEPS, "seq_len": 32, "checkpoint_every": CHECKPOINT_EVERY}})
    assert status == 201, fleet
    round_jobs = [seat["job_id"] for seat in fleet["rounds"][0]["participants"]]

    def jobs() -> list[dict]:
        return [service.request("GET", f"/v1/jobs/{job}")[1] for job in round_jobs]
    # the round's two jobs run at once, one on each host; one of them past a checkpoint
    running = poll_until(jobs, lambda js: {j["worker"] for j in js if j["status"] == "running"}
                         == set(names) and any(j["progress"]["step"] > CHECKPOINT_EVERY + 2
                                               for j in js), HANG_GUARD_S,
                         lambda js: f"round 0 never ran on both hosts at once: {js}\n"
                                    f"{service.output.read_text()[-3000:]}")
    for host in hosts:  # each job's runner keeps its room in its own host's data dir
        assert (host.data_dir / RESERVE_NAME).exists(), f"{host.data_dir} unused"
    doomed = max(running, key=lambda job: job["progress"]["step"])
    [survivor] = set(names) - {doomed["worker"]}
    kill_group(names[doomed["worker"]].worker)  # its worker, the horse and its engine

    done = service.finished(doomed["id"])
    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    assert done["worker"] == survivor
    messages = [event["message"] for event in service.job_events(doomed["id"])]
    assert any(m.startswith("re-queued: its worker") for m in messages), messages
    resumed = [m for m in messages if m.startswith("resuming from the checkpoint at step")]
    assert len(resumed) == 1 and int(resumed[0].rsplit(" ", 1)[1]) >= CHECKPOINT_EVERY
    steps = [m["step"] for m in
             service.request("GET", f"/v1/jobs/{doomed['id']}/metrics")[1]["data"]]
    assert steps == list(range(1, LOCAL_STEPS + 1))  # every step once: none lost, none twice

    finished = service.fleet_after_rounds(fleet["id"], 1)
    for current in finished["rounds"]:
        assert current["status"] == "done", current
        assert [seat["outcome"] for seat in current["participants"]] == ["trained"] * 2
    for job in jobs():  # each attempt ran at its host's threads, from its host's cache
        assert job["config"]["knobs"]["threads"] == names[job["worker"]].threads, job
    for host in hosts:
        assert list(host.cache.glob("preset-tiny-*")), f"{host.cache} packed nothing"
