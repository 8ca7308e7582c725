"""SIGTERM (and SIGINT) stop `mebp serve` whole, within the 10 s systemd and `docker stop`
give before their SIGKILL: with a job running and its event stream open, signalled at the
main process or at its whole process group, on the embedded deployment (SQLite and its own
Redis) and on PostgreSQL + Redis. Every process of the service's tree exits, the stream
ends, the job is back in the queue with its checkpoint, and (once per deployment) a service
started again on the same data resumes it from that checkpoint to success, every step
trained once. `mebp worker` on its own gives its job back the same way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from held_engines import hold_engine, release_once_asked_to_stop
from process_trees import (
    STOP_BOUND_S,
    describe,
    kill_tree,
    killed_after,
    process_tree,
    wait_until_exited,
)
from service_harness import (
    API_KEY,
    REDIS_TEST_URL,
    Service,
    poll_until,
    service_env,
    start_service,
    stop_service,
    temporary_postgres_database,
    tiny_job,
)
from sqlmodel import Session

from service.db import database_url, make_engine
from service.models import Job
from service.storage import job_dir
from worker.engine_zygote import ENGINE_NAME

STEPS = 40
ROWS = b"".join(json.dumps({"text": f"stop row {i}"}).encode() + b"\n" for i in range(16))


@pytest.fixture(params=["embedded", "shared"])
def deployment(request) -> Iterator[tuple[dict[str, str], str | None]]:
    """The service's environment and its database URL (None: SQLite in its data dir)."""
    if request.param == "embedded":
        yield {}, None
        return
    with temporary_postgres_database() as url:
        yield {"DATABASE_URL": url, "REDIS_URL": REDIS_TEST_URL,
               "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}"}, url


class StreamFollower(threading.Thread):
    """A client following the job's event stream until the server ends it."""

    def __init__(self, service: Service, job_id: str) -> None:
        super().__init__(daemon=True)
        self.service, self.job_id = service, job_id
        self.steps: list[int] = []
        self.kinds: list[str] = []
        self.following = threading.Event()  # a metric came through the stream
        self.ended = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.service.url, timeout=60, headers={
                    "Authorization": f"Bearer {API_KEY}",
                    "Accept": "text/event-stream"}) as client, \
                    client.stream("GET", f"/v1/jobs/{self.job_id}/events") as response:
                kind = None
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        kind = line.removeprefix("event: ")
                        self.kinds.append(kind)
                    elif line.startswith("data: ") and kind == "metric":
                        self.steps.append(json.loads(line.removeprefix("data: "))["step"])
                        if self.steps[-1] >= 2:
                            self.following.set()
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            self.error = exc
        finally:
            self.ended.set()


def job_row(url: str, job_id: str) -> Job:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            return session.get(Job, job_id)
    finally:
        engine.dispose()


@pytest.mark.parametrize(("target", "number"), [
    ("main process", signal.SIGTERM),
    ("process group", signal.SIGTERM),
    ("process group", signal.SIGINT),  # Ctrl+C in the terminal running it
])
def test_a_stop_signal_stops_the_service_and_gives_the_running_job_back(
        tmp_path, model_cache, deployment, target, number):
    """What a stop leaves is the same whichever signal and target stopped it, so the
    resume from it is run once per deployment, after the stop least like the others
    (SIGINT at the whole group, which every process gets at once)."""
    env, url = deployment
    url = url or database_url(None, tmp_path / "data")
    service = start_service(tmp_path, model_cache, env, own_group=True)
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        # a checkpoint each step: an engine still in its step at its stop deadline (a host
        # this busy) is killed, and the job resumes from its last step but one at worst
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, STEPS,
                                                           checkpoint_every=1))[1]
        stream = StreamFollower(service, job["id"])
        stream.start()
        directory = job_dir(tmp_path / "data" / "storage", job["id"])
        engine = hold_engine(tmp_path / "data" / "storage", job["id"], 2)
        processes = process_tree(service.process.pid)
        assert stream.following.wait(120), f"no metric streamed: {stream.error}\n" \
                                           f"{service.output.read_text()[-3000:]}"
        # the job's engine is the service's (forked from the worker's zygote, or started)
        assert engine in processes and (ENGINE_NAME.decode() in engine.name()
                                        or "worker.child" in engine.cmdline()), \
            describe(processes)
    except BaseException:
        kill_tree(service.process.pid)  # a held engine, a job running: none outlives the test
        raise
    finally:
        service.client.close()

    with killed_after(processes):
        signalled = time.monotonic()
        if target == "main process":
            os.kill(service.process.pid, number)
        else:
            os.killpg(service.process.pid, number)  # its own session: the group is its pid
        deadline = signalled + STOP_BOUND_S
        release_once_asked_to_stop(engine, deadline - time.monotonic())
        wait_until_exited(processes, deadline - time.monotonic(), number.name,
                          service.output)
    service.process.wait(timeout=5)
    assert stream.ended.wait(max(0.0, deadline - time.monotonic()) + 1), \
        "the event stream outlived the service"
    assert "end" not in stream.kinds  # ended by the stop, not by the job's end

    row = job_row(url, job["id"])
    state = directory / "checkpoint" / "state.json"
    assert row.status == "queued" and row.attempts == 1, (row.status, row.attempts,
                                                          row.error_message)
    saved = json.loads(state.read_text())["step"] if state.is_file() else None
    assert saved is not None and saved >= max(stream.steps) - 1, (saved, stream.steps)
    if (target, number) == ("process group", signal.SIGINT):
        resumes_to_success(tmp_path, model_cache, env, job["id"], saved)


def resumes_to_success(tmp_path, model_cache, env: dict[str, str], job_id: str,
                       saved: int) -> None:
    """A service started again on the stopped one's data resumes the job from its
    checkpoint at ``saved`` to success, every step trained once."""
    again = start_service(tmp_path, model_cache, env, own_group=True)
    try:
        done = again.finished(job_id, timeout_s=600)
        assert done["status"] == "succeeded" and done["attempts"] == 2, done
        messages = [event["message"] for event in again.job_events(job_id)]
        assert any(m.startswith("re-queued: its worker stopped") for m in messages), messages
        resumed = [m for m in messages if m.startswith("resuming from the checkpoint at step")]
        assert resumed == [f"resuming from the checkpoint at step {saved}"], messages
        steps = [m["step"] for m in
                 again.request("GET", f"/v1/jobs/{job_id}/metrics")[1]["data"]]
        assert steps == list(range(1, STEPS + 1))  # every step once: none lost, none twice
    finally:
        stop_service(again)


def start_worker(root, cache, env: dict[str, str]) -> subprocess.Popen:
    """`mebp worker` on its own, serving the embedded service's Redis and data dir."""
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker"], start_new_session=True,
        env=service_env(cache, {**env, "MEBP_DATA_DIR": str(root / "data"),
                                "REDIS_URL": f"unix://{root / 'data' / 'redis.socket'}"}))


def test_a_worker_alone_gives_its_job_back_on_sigterm(tmp_path, model_cache):
    service = start_service(tmp_path, model_cache, {}, workers=0)
    worker = start_worker(tmp_path, model_cache, {})
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, STEPS,
                                                           checkpoint_every=1))[1]
        engine = hold_engine(tmp_path / "data" / "storage", job["id"], 2)
        running = service.wait_for(job["id"], lambda j: j["progress"]["step"] >= 2, 300)
        processes = process_tree(worker.pid)
        with killed_after(processes):
            worker.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_BOUND_S
            release_once_asked_to_stop(engine, STOP_BOUND_S)
            wait_until_exited(processes, deadline - time.monotonic(), "SIGTERM")
        stopped = service.request("GET", f"/v1/jobs/{job['id']}")[1]
        assert stopped["status"] == "queued", stopped
        assert stopped["progress"]["step"] >= running["progress"]["step"]
        worker = start_worker(tmp_path, model_cache, {})
        done = service.finished(job["id"], timeout_s=600)
        assert done["status"] == "succeeded" and done["attempts"] == 2, done
        messages = [event["message"] for event in service.job_events(job["id"])]
        assert any(m.startswith("re-queued: its worker stopped (SIGTERM)") for m in messages)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        stop_service(service)


def test_a_stop_signal_while_the_model_is_packed_gives_the_job_back(tmp_path,
                                                                      seed_calibration):
    """Packing a model takes minutes for a real one: a stop then ends the packing (nothing
    partial is left in the cache) and gives the job back, within the same bound."""
    cache = tmp_path / "cache"  # calibrated, with no model packed in it yet
    cores = os.cpu_count() or 1
    seed_calibration(cache, None)
    for threads in range(1, cores + 1):
        seed_calibration(cache, threads, speed=threads / cores)
    service = start_service(tmp_path, cache, {}, own_group=True)
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        job = service.request("POST", "/v1/jobs", {
            **tiny_job(dataset, STEPS), "model": "preset:smollm2-135m"})[1]
        poll_until(lambda: [event["message"] for event in service.job_events(job["id"])],
                   lambda messages: any(m.startswith("packing ") for m in messages), 300,
                   lambda messages: f"packing never reported: {messages}")
        processes = process_tree(service.process.pid)
    finally:
        service.client.close()

    with killed_after(processes):
        os.kill(service.process.pid, signal.SIGTERM)
        wait_until_exited(processes, STOP_BOUND_S, "SIGTERM during packing", service.output)
    row = job_row(database_url(None, tmp_path / "data"), job["id"])
    assert row.status == "queued", (row.status, row.error_message)
    assert [path.name for path in cache.iterdir() if path.name.endswith(".tmp")] == []
    assert not any(path.name.startswith("preset-smollm2-135m") for path in cache.iterdir())
