"""A worker's lease on a job, with the clock in the test's hands (heartbeats written into the
past, single beats called directly; nothing sleeps): a stale job is re-queued and its old
worker's next beat finds the lease lost, even once another worker holds it; a beat that
lands before the reconciler acts keeps the job; a job out of attempts fails worker_lost."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from service_harness import REDIS_TEST_URL
from sqlmodel import Session

from app.reconciler import Reconciler
from service.db import database_url, make_engine, upgrade_database
from service.models import Dataset, Job, utc_now
from service.queue import connect, job_queue
from service.settings import Settings
from worker.lease import Heartbeat, claim_job

TIMEOUT_S = 30.0


@pytest.fixture
def deployment(tmp_path):
    url = database_url(None, tmp_path)
    upgrade_database(url)
    engine = make_engine(url)
    settings = Settings(data_dir=tmp_path, heartbeat_timeout_s=TIMEOUT_S, max_attempts=2,
                        REDIS_URL=REDIS_TEST_URL, queue_name=f"mebp-test-{uuid.uuid4().hex[:8]}")
    queue = job_queue(connect(REDIS_TEST_URL), settings.queue_name)
    with Session(engine) as session:
        session.add(Dataset(id="d1", tenant="t", filename="d.jsonl", path="/dev/null",
                            bytes=0, rows=1, sha256="0" * 64))
        session.add(Job(id="j1", tenant="t", status="queued", model="preset:tiny",
                        config={}, training_file="d1"))
        session.commit()
    yield engine, Reconciler(engine, queue, settings), queue
    queue.empty()
    engine.dispose()


def claim(engine, worker: str) -> Job:
    with Session(engine) as session:
        job = claim_job(session, worker, max_running_per_tenant=4)
        assert job is not None and job.worker == worker
        return job


def age_heartbeat(engine, seconds: float) -> None:
    """The worker went silent ``seconds`` ago."""
    with Session(engine) as session:
        job = session.get(Job, "j1")
        job.heartbeat_at = utc_now() - timedelta(seconds=seconds)
        session.add(job)
        session.commit()


def job_row(engine) -> Job:
    with Session(engine) as session:
        return session.get(Job, "j1")


def test_a_stale_job_is_requeued_and_its_old_worker_finds_the_lease_lost(deployment):
    engine, reconciler, queue = deployment
    claim(engine, "old:1")
    old = Heartbeat(engine, "j1", "old:1", interval_s=3600)
    assert old.beat() and not old.lost.is_set()

    age_heartbeat(engine, TIMEOUT_S - 1)
    assert reconciler.reconcile() == [] and job_row(engine).status == "running"
    age_heartbeat(engine, TIMEOUT_S + 1)
    assert reconciler.reconcile() == ["j1"]
    assert job_row(engine).status == "queued" and "j1" in queue.job_ids

    claim(engine, "new:2")  # the next attempt, on another worker
    assert not old.beat() and old.lost.is_set()  # the old one must stop, writing nothing
    new = Heartbeat(engine, "j1", "new:2", interval_s=3600)
    assert new.beat() and not new.lost.is_set()
    row = job_row(engine)
    assert (row.status, row.worker, row.attempts) == ("running", "new:2", 2)


def test_a_beat_that_lands_first_keeps_the_job(deployment):
    engine, reconciler, _ = deployment
    claim(engine, "slow:1")
    age_heartbeat(engine, TIMEOUT_S + 5)
    assert Heartbeat(engine, "j1", "slow:1", interval_s=3600).beat()  # just in time
    assert reconciler.reconcile() == []
    assert (job_row(engine).status, job_row(engine).worker) == ("running", "slow:1")


def test_a_job_lost_on_its_last_attempt_fails_worker_lost(deployment):
    engine, reconciler, _ = deployment
    for attempt, worker in enumerate(("a:1", "b:2"), start=1):
        claim(engine, worker)
        age_heartbeat(engine, TIMEOUT_S + 1)
        reconciler.reconcile()
        assert job_row(engine).attempts == attempt
    row = job_row(engine)
    assert row.status == "failed" and row.error_code == "worker_lost"
    assert "attempt 2 of 2" in row.error_message
    assert not Heartbeat(engine, "j1", "b:2", interval_s=3600).beat()
