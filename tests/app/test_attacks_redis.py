"""The embedded Redis and the worker count (issue 12, item 3 and part of 10): a SIGKILLed
embedded redis-server was never restarted (503s until `mebp serve` was restarted by hand, a
job interrupted by it stuck `queued`, its worker restarted 82 times), and a SIGKILLed
worker stayed in `/v1/health`'s count for minutes. Now `mebp serve` restarts its Redis on
the same socket, the job resumes by itself, and health counts workers heard from lately."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from held_engines import hold_engine, release, storage_of
from service_harness import poll_until, service_env, start_service, stop_service, tiny_job

from service.queue import WORKER_HEARTBEAT_S, WORKER_LIVE_S

ROWS = b"".join(json.dumps({"text": f"redis row {i}"}).encode() + b"\n" for i in range(16))
FAST_RECOVERY = {"MEBP_HEARTBEAT_TIMEOUT_S": "3", "MEBP_RECONCILE_INTERVAL_S": "0.5"}
RESTART_WITHIN_S = 10.0  # the supervisor checks every 0.5 s; a loaded machine starts slowly



def socket_of(service) -> Path:
    return service.output.parent / "data" / "redis.socket"


def embedded_redis(service) -> psutil.Process | None:
    """The redis-server on the service's socket (its process title names the socket),
    wherever it runs: a child of `mebp serve`, or daemonized."""
    socket = str(socket_of(service))
    for process in psutil.process_iter(["name", "cmdline"]):
        if process.info["name"] == "redis-server" and \
                socket in " ".join(process.info["cmdline"] or ()):
            return process
    return None


def kill_embedded_redis(service) -> int:
    redis = embedded_redis(service)
    assert redis is not None, "no embedded redis-server found"
    redis.kill()
    redis.wait(timeout=10)
    return redis.pid


def wait_until(condition, timeout_s: float, what: str, service):
    return poll_until(condition, bool, timeout_s, lambda _: (
        f"{what} not within {timeout_s} s\n{service.output.read_text()[-3000:]}"))


def health(service) -> tuple[int, dict]:
    try:
        response = httpx.get(service.url + "/v1/health", timeout=10)
        return response.status_code, response.json()
    except (httpx.HTTPError, ValueError):
        return 0, {}


@pytest.fixture
def private_service(tmp_path, model_cache):
    started = []

    def start(extra_env: dict, workers: int = 1):
        started.append(start_service(tmp_path, model_cache, extra_env, workers=workers))
        return started[-1]
    yield start
    for service in started:
        stop_service(service)
        assert embedded_redis(service) is None  # stopped with the service, not orphaned


def test_the_embedded_redis_killed_while_idle_is_restarted_and_serves_jobs(private_service):
    service = private_service(FAST_RECOVERY)
    killed = kill_embedded_redis(service)
    wait_until(lambda: (redis := embedded_redis(service)) and redis.pid != killed,
               RESTART_WITHIN_S, "a new embedded redis-server", service)
    wait_until(lambda: health(service)[0] == 200, RESTART_WITHIN_S, "health 200", service)
    log = service.output.read_text()
    assert re.search(rf"embedded Redis {killed} exited with code -9", log), log[-2000:]
    dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
    status, job = service.request("POST", "/v1/jobs", tiny_job(dataset, 3))
    assert status == 201, job
    assert service.finished(job["id"], timeout_s=120)["status"] == "succeeded"
    # the worker that outlived the restart is listed again (it re-registers as it beats)
    wait_until(lambda: health(service)[1].get("workers") == 1, WORKER_LIVE_S,
               "one worker counted", service)


def worker_family(service, engine: psutil.Process) -> list[psutil.Process]:
    """The service's worker running ``engine``, with its horse and engine (the service has
    an exports worker too, whose cmdline also says worker: the one above the engine)."""
    worker = next(parent for parent in engine.parents()
                  if parent.ppid() == service.process.pid and "worker" in parent.cmdline())
    family = [worker, *worker.children(recursive=True)]
    assert len(family) >= 3, family  # the worker, RQ's horse running the job, the engine
    return family


def kill(family: list[psutil.Process]) -> None:
    """SIGKILL a worker family, as when it died at a Redis heartbeat and took the engine with
    it. Members that already exited are fine."""
    for process in family:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    assert not psutil.wait_procs(family, timeout=10)[1]


@pytest.mark.slow
@pytest.mark.parametrize("with_worker", [False, True], ids=["redis", "redis-and-worker"])
def test_a_job_interrupted_by_the_embedded_redis_dying_resumes_and_succeeds(private_service,
                                                                           with_worker):
    service = private_service(FAST_RECOVERY)
    dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
    steps = 60
    job = service.request("POST", "/v1/jobs", tiny_job(dataset, steps, checkpoint_every=5))[1]
    engine = hold_engine(storage_of(service), job["id"], 10)  # mid-job when Redis dies
    # Taken before Redis dies: the worker may exit on its own once Redis is gone.
    family = worker_family(service, engine)
    kill_embedded_redis(service)
    if with_worker:
        kill(family)
    release(engine)
    wait_until(lambda: health(service)[0] == 200, RESTART_WITHIN_S, "health 200", service)
    done = service.finished(job["id"], timeout_s=150)
    assert done["status"] == "succeeded", done
    metrics = service.request("GET", f"/v1/jobs/{job['id']}/metrics")[1]["data"]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))  # each step once
    events = service.job_events(job["id"])
    terminal = [e for e in events if e["data"].get("status") in ("succeeded", "failed",
                                                                 "cancelled")]
    assert len(terminal) == 1, terminal
    if with_worker:  # re-queued by the reconciler into the restarted Redis, and resumed
        assert done["attempts"] == 2, done
        messages = [event["message"] for event in events]
        assert any(m.startswith("resuming from the checkpoint at step") for m in messages)
    # a worker that lost Redis is restarted once, and waits for Redis rather than spin
    exits = re.findall(r"worker \d+ exited", service.output.read_text())
    assert len(exits) <= 2, exits


def test_a_killed_worker_leaves_the_health_count_within_bounded_time(private_service,
                                                                      model_cache):
    service = private_service({}, workers=0)
    env = service_env(model_cache, {"MEBP_DATA_DIR": str(socket_of(service).parent),
                                    "REDIS_URL": f"unix://{socket_of(service)}"})
    worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env,
                              start_new_session=True)
    try:
        wait_until(lambda: health(service)[1].get("workers") == 1, 90, "the worker counted",
                   service)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        bound_s = WORKER_LIVE_S + WORKER_HEARTBEAT_S + 5  # + a health request on a busy host
        wait_until(lambda: health(service)[1].get("workers") == 0, bound_s,
                   "the killed worker dropped from the count", service)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
