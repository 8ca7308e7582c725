"""A base export runs on a worker, not in the API process: killed mid-export (its work horse
alone, or the whole worker with it), it leaves nothing half-written at the export's path and
is made again, then served whole. Against a real `mebp serve` with one worker over the
machine's PostgreSQL and Redis; smollm2-135m's q4_1 and q8_0 GGUFs take seconds to write,
long enough to kill one midway."""

from __future__ import annotations

import hashlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import gguf
import psutil
import pytest
from rq import Queue
from service_harness import (
    REDIS_TEST_URL,
    Service,
    start_service,
    stop_service,
    temporary_postgres_database,
)
from waiting import poll_until

from service.base_export_queue import lease_key, marker_key
from service.bases import is_kept
from service.queue import connect

MODEL = "preset:smollm2-135m"
BASE = f"/v1/models/{MODEL}/base"
TIMEOUT_S = 600  # packing smollm2-135m alone takes about a minute on 2 busy cores
CATCH_ATTEMPTS = 5
HOLD_S = 10.0  # a held process's threads all stop within a scheduling slice or two

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, model_cache) -> Iterator[tuple[Service, str, Path]]:
    """(the service, its queue name, its kept exports' directory)"""
    root = tmp_path_factory.mktemp("export-kill")
    queue_name = f"mebp-test-{uuid.uuid4().hex[:8]}"
    with temporary_postgres_database() as url:
        service = start_service(root, model_cache, {
            "DATABASE_URL": url, "REDIS_URL": REDIS_TEST_URL, "MEBP_QUEUE_NAME": queue_name,
            "MEBP_STORAGE_DIR": str(root / "storage")}, workers=1)
        try:
            yield service, queue_name, root / "storage" / "bases"
        finally:
            stop_service(service)


def wait_for(what: str, condition, timeout_s: float = TIMEOUT_S):
    return poll_until(condition, bool, timeout_s, lambda _: f"{what}: not in {timeout_s} s",
                      interval_s=0.05)


def exporting_run(service: Service, queue_name: str, bases: Path, params: dict,
                  ending: str) -> tuple[psutil.Process, str]:
    """Ask for the export, and hold the work horse of the run its marker names (SIGSTOP: it
    cannot finish before the test acts) once it writes the file (past packing: its scratch
    directory exists) under its lease; that horse and its RQ job id. Only that run's lease
    counts: a run killed earlier leaves its lease until it lapses. A horse caught too late
    (its export already at its path, or the horse gone by the time it is held: a loaded
    machine can deschedule this test for the seconds a write takes) is let go, its export
    removed, and the export asked for again."""
    redis = connect(REDIS_TEST_URL)

    def holder() -> tuple[int, str, Path] | None:
        scratch = next(iter(bases.glob(f".*{ending}.tmp-work")), None)
        if scratch is None:
            return None
        target_name = scratch.name[1:-len(".tmp-work")]
        marker = redis.get(marker_key(queue_name, target_name))
        job_id = marker.decode().split()[0] if marker else None
        lease = job_id and redis.get(lease_key(queue_name, job_id))
        if not lease:
            return None
        return int(lease.decode().rsplit(":", 1)[1]), job_id, bases / target_name
    for _ in range(CATCH_ATTEMPTS):
        asked = service.client.get(BASE, params=params)
        assert asked.status_code == 202, asked.text
        pid, job_id, target = wait_for("the export writing its file", holder)
        try:
            horse = psutil.Process(pid)
            horse.suspend()
            # SIGSTOP acts when each thread next runs: judge the run once all of them have
            poll_until(lambda held=pid: all_stopped(held), bool, HOLD_S,
                       lambda _, held=pid: f"horse {held}: not all its threads stopped",
                       interval_s=0.01)
            if not target.exists():  # not yet moved to its path: mid-write
                return horse, job_id
            horse.resume()
        except psutil.NoSuchProcess:  # it ended before it was held
            pass
        wait_for("the run caught too late, ended with its export kept",
                 lambda done=target: is_kept(done) and not redis.exists(
                     marker_key(queue_name, done.name)) and not holder())
        for made in [p for p in bases.iterdir() if ending in p.name]:
            made.unlink()
    raise AssertionError(f"no run of the export held before it was whole in {CATCH_ATTEMPTS}")


def all_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T); NoSuchProcess if the
    process has ended."""
    try:
        states = {(task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                  for task in Path(f"/proc/{pid}/task").iterdir()}
    except FileNotFoundError:
        states = {"X"}
    if states & {"Z", "X"}:
        raise psutil.NoSuchProcess(pid)
    return states == {"T"}


def sigterm_pending(pid: int) -> bool:
    """Whether a SIGTERM sent to process ``pid`` waits for it (held, it acts on none), or
    has ended it already (a thread not yet held when it came takes it at once)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields["State"].split()[0] in ("Z", "X"):
        return True
    return bool(int(fields["ShdPnd"].split()[0], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize(("quant", "kill"), [("q4_1", "horse"), ("q8_0", "worker")])
def test_an_export_killed_midway_leaves_nothing_half_written_and_is_made_again(
        deployment, quant, kill):
    service, queue_name, bases = deployment
    params = {"format": "gguf", "quant": quant}
    ending = f"-{quant}.gguf"
    horse, _ = exporting_run(service, queue_name, bases, params, ending)
    worker = horse.ppid()
    assert worker != service.process.pid  # made by a worker's horse, not the API process
    victims = [horse.pid] if kill == "horse" else [worker, horse.pid]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    wait_for("the killed processes gone", lambda: not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        for pid in victims))
    # nothing at the export's path: what was being written stays in its scratch place
    assert not [p for p in bases.iterdir() if p.name.endswith(ending)]
    answer = service.client.get(BASE, params=params)
    assert answer.status_code == 202, answer.text  # being made again (or queued to be)
    made = wait_for("the export made again", lambda: (
        r := service.client.get(BASE, params=params)).status_code == 200 and r)
    assert hashlib.sha256(made.content).hexdigest() == made.headers["x-base-sha256"]
    path = bases / next(p.name for p in bases.iterdir() if p.name.endswith(ending))
    reader = gguf.GGUFReader(path)  # whole: every tensor's data where its header says
    assert {t.tensor_type.name for t in reader.tensors} == {quant.upper(), "F32"}
    assert not [p for p in bases.iterdir() if ending + ".tmp-" in p.name]  # cleaned up
    if kill == "worker":  # `mebp serve` started another worker, which made it
        assert worker not in [c.pid for c in psutil.Process(service.process.pid).children()]


def test_an_export_a_stop_signal_ended_is_queued_again_at_once_as_a_new_run(deployment):
    """A restart of the service ends the export's horse: its worker queues it again under a
    new RQ id (no retry of the old one spent, so restarts never use up an export), and it is
    made with no request asking again (the listing only looks)."""
    service, queue_name, bases = deployment
    params = {"format": "gguf", "quant": "q4_1"}
    ending = "-q4_1.gguf"
    for stale in [p for p in bases.iterdir() if ending in p.name] if bases.is_dir() else []:
        stale.unlink()  # the test above made it: made again here
    horse, job_id = exporting_run(service, queue_name, bases, params, ending)
    os.kill(horse.ppid(), signal.SIGTERM)  # its exports worker, as `mebp serve` stopping
    # the worker relays its stop to the horse: held, the horse keeps it pending, and dies of
    # it once resumed (resumed sooner, it could finish the export before the relay)
    wait_for("the stop relayed to the horse", lambda: sigterm_pending(horse.pid))
    horse.resume()
    redis = connect(REDIS_TEST_URL)
    leases = f"{queue_name}:base-export-lease:*"
    queued = Queue(f"{queue_name}-exports", connection=redis)
    new_ids = wait_for("the export queued again", lambda: {
        *queued.job_ids, *(k.decode().rsplit(":", 1)[1] for k in redis.keys(leases))} - {job_id})
    assert job_id not in new_ids
    formats = f"{BASE}/formats"

    def kept() -> bool:
        listed = service.client.get(formats, params={"quant": "int4"})
        return any(e["status"] == "kept" and e["quant"] == "q4_1" for e in listed.json()["data"])
    wait_for("the export made again, unasked", kept)
