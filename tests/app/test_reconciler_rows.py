"""A row that no longer validates (hand-edited, or written by code that renamed a key) does
not stop the reconciler: it is left out, logged naming the row and why, and the round goes on
with the others. Real rows in SQLite and in the machine's PostgreSQL, real Redis."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest
from service_harness import REDIS_TEST_URL
from sqlalchemy import text
from sqlmodel import Session

from app.reconciler import Reconciler
from mebp_core.config import TrainConfig
from service.db import make_engine
from service.fleet_spec import FleetRequest, FleetSpec
from service.models import Dataset, Fleet, Job, utc_now
from service.queue import connect, job_queue
from service.settings import Settings

TIMEOUT_S = 30.0
RENAMED = '{"planned": true, "configurashun": "lazy-tile8M"}'  # a key renamed


@pytest.fixture
def deployment(migrated_database_url, tmp_path):
    engine = make_engine(migrated_database_url)
    settings = Settings(data_dir=tmp_path, heartbeat_timeout_s=TIMEOUT_S, max_attempts=3,
                        max_running_jobs_per_tenant=4, advance_grace_s=5.0,
                        REDIS_URL=REDIS_TEST_URL,
                        queue_name=f"mebp-test-{uuid.uuid4().hex[:8]}")
    queue = job_queue(connect(REDIS_TEST_URL), settings.queue_name)
    long_ago = utc_now() - timedelta(seconds=600)
    with Session(engine) as session:
        session.add(Dataset(id="d1", tenant="t", filename="d.jsonl", path="/dev/null",
                            bytes=0, rows=1, sha256="0" * 64))
        session.add(Fleet(id="fleet-bad", tenant="t", model="preset:tiny", status="preparing",
                          created_at=long_ago, spec=FleetSpec(
                              request=FleetRequest(training_file="d1",
                                                   hyperparameters={"steps": 2}),
                              members=[])))
        for job_id, status in (("lost-good", "running"), ("lost-bad", "running"),
                               ("queued-good", "queued"), ("queued-bad", "queued")):
            session.add(Job(id=job_id, tenant="t", status=status, model="preset:tiny",
                            config=TrainConfig().model_dump(mode="json"), training_file="d1",
                            attempts=1, worker="gone:1", created_at=long_ago,
                            heartbeat_at=long_ago if status == "running" else None))
        session.commit()
        for job_id in ("lost-bad", "queued-bad"):
            session.connection().execute(text("update jobs set plan = :plan where id = :id"),
                                         {"plan": RENAMED, "id": job_id})
        session.connection().execute(text(
            "update fleets set spec = :spec where id = 'fleet-bad'"),
            {"spec": '{"request": {"training_file": "d1", "hyperparameters": {"steps": 2}}}'})
        session.commit()
    yield engine, Reconciler(engine, queue, settings), queue
    queue.empty()
    engine.dispose()


def test_a_row_that_does_not_validate_is_skipped_and_named_and_the_others_go_on(
        deployment, caplog):
    engine, reconciler, queue = deployment
    with caplog.at_level(logging.WARNING):
        enqueued = reconciler.reconcile()
    assert enqueued == ["lost-good", "queued-good"]
    assert set(queue.job_ids) == {"lost-good", "queued-good"}
    with Session(engine) as session:
        assert session.get(Job, "lost-good").status == "queued"
    logged = caplog.text
    for job_id in ("lost-bad", "queued-bad"):
        assert f"jobs row id='{job_id}': its stored plan does not validate" in logged
    assert "configuration: Field required" in logged
    assert "fleets row id='fleet-bad': its stored spec does not validate: members: " \
           "Field required" in logged
