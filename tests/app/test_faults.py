"""Faults, each made real by killing or starving processes the test started itself: a worker
killed mid-job, Redis restarted empty, the database down, the storage full."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
import torch
from service_harness import free_port, service_env, start_service, stop_service

from mebp_core.federated.rounds import fate
from worker.memory_cap import GROUP_PARENT, v1_hierarchy, v2_hierarchy

ROWS = b"".join(json.dumps({"text": f"fault row {i}"}).encode() + b"\n" for i in range(16))
FAST_RECOVERY = {"MEBP_HEARTBEAT_TIMEOUT_S": "3", "MEBP_RECONCILE_INTERVAL_S": "0.5"}


def job_body(dataset: str, steps: int, **hyper) -> dict:
    return {"model": "preset:tiny", "training_file": dataset, "device": "pixel-8",
            "hyperparameters": {"steps": steps, "seq_len": 32, **hyper}}


def start_worker(root: Path, cache: Path, extra_env: dict) -> subprocess.Popen:
    """A `mebp worker` the test can kill."""
    return subprocess.Popen([sys.executable, "-m", "app.cli", "worker"],
                            env=service_env(cache, {**extra_env,
                                                    "MEBP_DATA_DIR": str(root / "data")}),
                            start_new_session=True)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the worker and everything under it (RQ's work horse runs the job in a process
    group of its own), as when its machine dies."""
    family = [process.pid] + [child.pid for child in
                              psutil.Process(process.pid).children(recursive=True)]
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=30)


def events_of(service, job_id: str) -> list[dict]:
    return service.request("GET", f"/v1/jobs/{job_id}/events")[1]


@pytest.fixture
def embedded_with_external_workers(tmp_path, model_cache):
    """`mebp serve` with no worker of its own: the test runs (and kills) the workers."""
    def start(**extra_env):
        service = start_service(tmp_path, model_cache, {**FAST_RECOVERY, **extra_env},
                                workers=0)
        started.append(service)
        env = {**FAST_RECOVERY, **extra_env,
               "REDIS_URL": f"unix://{tmp_path / 'data' / 'redis.socket'}"}
        return service, lambda: workers.append(start_worker(tmp_path, model_cache, env)) \
            or workers[-1]
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
    job = service.request("POST", "/v1/jobs", job_body(dataset, 80, checkpoint_every=5))[1]
    service.wait_for(job["id"], lambda j: j["progress"]["step"] >= 12, timeout_s=60)
    kill_group(first)  # the worker, the horse running the job and the engine, at once
    new_worker()
    done = service.finished(job["id"], timeout_s=120)
    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    messages = [event["message"] for event in events_of(service, job["id"])]
    assert any(m.startswith("re-queued: its worker") for m in messages), messages
    resumed = [m for m in messages if m.startswith("resuming from the checkpoint at step")]
    assert len(resumed) == 1 and int(resumed[0].rsplit(" ", 1)[1]) >= 10
    steps = [m["step"] for m in service.request("GET", f"/v1/jobs/{job['id']}/metrics")[1]["data"]]
    assert steps == list(range(1, 81))  # every step once: none lost, none twice
    for hierarchy in filter(None, (v2_hierarchy(), v1_hierarchy())):
        assert not list((hierarchy / GROUP_PARENT).glob(f"{job['id']}-a*"))


def test_a_job_whose_worker_is_lost_too_often_fails_worker_lost(
        embedded_with_external_workers):
    service, new_worker = embedded_with_external_workers(MEBP_MAX_ATTEMPTS="1")
    worker = new_worker()
    dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
    job = service.request("POST", "/v1/jobs", job_body(dataset, 100_000))[1]
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
    service.wait_for(doomed, lambda j: j["progress"]["step"] >= 8, timeout_s=120)
    kill_group(first)  # the worker, the horse running device 0's job and its engine
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


@pytest.fixture
def own_redis():
    """A redis-server of the test's own on a free port, keeping nothing on disk."""
    port = free_port()
    command = [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no"]

    def start() -> subprocess.Popen:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
        return process
    servers = [start()]
    yield f"redis://127.0.0.1:{port}/0", servers, start
    for server in servers:
        server.kill()
        server.wait()


def test_redis_restarted_empty_loses_nothing_and_is_a_503_while_down(tmp_path, model_cache,
                                                                       own_redis):
    url, servers, restart = own_redis
    service = start_service(tmp_path, model_cache, {**FAST_RECOVERY, "REDIS_URL": url})
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        jobs = [service.request("POST", "/v1/jobs", job_body(dataset, 20))[1]["id"]
                for _ in range(3)]
        servers[0].kill()  # the queue is gone with it
        servers[0].wait()
        response = service.client.post("/v1/jobs", json=job_body(dataset, 2))
        assert response.status_code == 503, response.text
        assert "Redis" in response.json()["detail"] and response.headers["retry-after"]
        health = httpx.get(service.url + "/v1/health")
        assert health.status_code == 503 and health.json()["redis"] == "unavailable"
        assert service.client.get(f"/v1/jobs/{jobs[0]}").status_code == 200  # the database
        servers.append(restart())
        for job_id in jobs:
            done = service.finished(job_id, timeout_s=180)
            assert done["status"] == "succeeded", done
            terminal = [e for e in events_of(service, job_id)
                        if e["data"].get("status") in ("succeeded", "failed", "cancelled")]
            assert len(terminal) == 1
        assert service.request("GET", "/v1/jobs")[1]["count"] == 3  # the refused one was not made
    finally:
        stop_service(service)


@pytest.fixture
def own_postgres():
    """A PostgreSQL cluster of the test's own, run as the postgres user (in a directory it
    can reach: pytest's are private to root)."""
    bin_dir = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1])
    home, port = Path(tempfile.mkdtemp(prefix="mebp-pg-")), free_port()
    os.chmod(home, 0o755)
    shutil.chown(home, "postgres")
    data = home / "data"

    def pg(*args: str, check: bool = True) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(bin_dir / args[0]), *args[1:]],
                       check=check, capture_output=True, timeout=120)

    def start() -> None:
        pg("pg_ctl", "-D", str(data), "-l", str(home / "log"), "-w", "-o",
           f"-p {port} -k {home} -h 127.0.0.1", "start")

    def stop(check: bool = True) -> None:
        pg("pg_ctl", "-D", str(data), "-m", "immediate", "stop", check=check)

    pg("initdb", "-D", str(data), "-A", "trust", "-U", "postgres")
    start()
    yield f"postgresql://postgres@127.0.0.1:{port}/postgres", start, stop
    stop(check=False)
    shutil.rmtree(home, ignore_errors=True)


def test_the_database_down_is_a_503_and_the_service_carries_on(tmp_path, model_cache,
                                                                own_postgres):
    url, start, stop = own_postgres
    service = start_service(tmp_path / "service", model_cache, {"DATABASE_URL": url})
    try:
        assert service.client.get("/v1/jobs").status_code == 200
        stop()
        for path in ("/v1/jobs", "/v1/datasets", "/v1/devices"):
            response = service.client.get(path)
            assert response.status_code == 503, (path, response.text)
            assert response.json() == {"detail": "the database is unavailable; retry shortly"}
        assert httpx.get(service.url + "/v1/health").json()["database"] == "unavailable"
        start()
        assert service.client.get("/v1/jobs").status_code == 200
        assert service.process.poll() is None
    finally:
        stop_service(service)


@pytest.fixture
def small_storage(tmp_path):
    """A 400 KB tmpfs as the storage root: room for a dataset and a job's logs, not for
    its adapter."""
    storage = tmp_path / "storage"
    storage.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(storage)],
                   check=True)
    yield storage
    subprocess.run(["umount", "-l", str(storage)], check=True)


def test_a_full_disk_while_writing_the_adapter_fails_the_job_and_keeps_nothing(
        tmp_path, model_cache, small_storage):
    service = start_service(tmp_path / "service", model_cache,
                            {"MEBP_STORAGE_DIR": str(small_storage)})
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        job = service.request("POST", "/v1/jobs", job_body(dataset, 3, checkpoint_every=1000))
        done = service.finished(job[1]["id"])
        assert done["status"] == "failed" and done["error"]["code"] == "storage_full", done["error"]
        assert done["adapter"] is None
        assert service.client.get(f"/v1/jobs/{done['id']}/adapter").status_code == 404
        job_dir = small_storage / "jobs" / done["id"]
        assert not [p for p in job_dir.iterdir() if p.name.startswith((".adapter", "adapter"))]
        after = service.request("POST", "/v1/jobs", job_body(dataset, 1))[1]
        assert service.finished(after["id"])["status"] in ("succeeded", "failed")
    finally:
        stop_service(service)

