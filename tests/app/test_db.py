"""The migrations build every table on SQLite and on the machine's real PostgreSQL, and a
second upgrade is a no-op."""

from __future__ import annotations

import os
import subprocess
import sys

from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from service.db import MIGRATIONS, database_url, make_engine, upgrade_database

TABLES = {"api_keys", "devices", "datasets", "fleets", "jobs", "events", "metrics", "adapters",
          "dashboard_sessions", "comparisons", "alembic_version"}
HEAD = ScriptDirectory(str(MIGRATIONS)).get_current_head()


def assert_schema(url: str) -> None:
    engine = make_engine(url)
    try:
        names = set(inspect(engine).get_table_names())
        assert TABLES <= names, TABLES - names
        columns = {c["name"] for c in inspect(engine).get_columns("jobs")}
        assert {"status", "config", "plan", "enforcement", "error_code", "memory_budget_bytes",
                "peak_anon_bytes", "idempotency_key", "metadata", "cancel_requested",
                "peak_memory_bytes", "error_detail"} <= columns
        with engine.connect() as connection:
            version = connection.execute(text("select version_num from alembic_version"))
            assert version.scalar_one() == HEAD
    finally:
        engine.dispose()


def test_sqlite_in_the_data_dir_by_default(tmp_path):
    url = database_url(None, tmp_path)
    assert url == f"sqlite:///{tmp_path.resolve() / 'mebp.db'}"
    upgrade_database(url)
    upgrade_database(url)  # idempotent
    assert_schema(url)


def test_postgresql_through_database_url(postgres_url):
    assert database_url(postgres_url, "/unused") == postgres_url
    upgrade_database(postgres_url)
    upgrade_database(postgres_url)
    assert_schema(postgres_url)


def test_mebp_db_upgrade_command(tmp_path, postgres_url):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade",
                           "--data-dir", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_schema(database_url(None, tmp_path))
    done = subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade"],
                          capture_output=True, text=True, timeout=120,
                          env={**env, "DATABASE_URL": postgres_url})
    assert done.returncode == 0, done.stderr
    assert_schema(postgres_url)


def test_the_migrations_build_exactly_the_tables_the_models_declare(tmp_path, postgres_url):
    """A column added to a model without a migration (or the reverse) fails here."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    import service.models  # noqa: F401  (the tables register on SQLModel.metadata)

    for url in (f"sqlite:///{tmp_path / 'compare.db'}", postgres_url):
        upgrade_database(url)
        engine = make_engine(url)
        try:
            with engine.connect() as connection:
                diff = compare_metadata(MigrationContext.configure(connection),
                                        SQLModel.metadata)
        finally:
            engine.dispose()
        assert diff == [], (url, diff)


def test_a_job_that_kept_an_adapter_before_0017_lists_it_as_its_last_checkpoint(
        migrated_database_url):
    """0017 backfills: a succeeded or cancelled job's adapter, at its last step with that
    step's losses; a failed job and a fleet's phone list none."""
    from alembic import command
    from alembic.config import Config
    from sqlmodel import Session, select

    from service.fleet_spec import FleetRequest, FleetSpec
    from service.job_checkpoints import checkpoint_id
    from service.models import Adapter, Dataset, Fleet, Job, JobCheckpoint, Metric

    engine = make_engine(migrated_database_url)
    ended = {"job-done": ("succeeded", 3), "job-stopped": ("cancelled", 2),
             "job-failed": ("failed", 1), "job-phone": ("succeeded", 3)}
    with Session(engine) as session:
        session.add(Dataset(id="d1", tenant="t", filename="d.jsonl", path="/dev/null",
                            bytes=0, rows=0, sha256="0" * 64))
        request = FleetRequest(training_file="d1", hyperparameters={"steps": 3})
        session.add(Fleet(id="fl-1", tenant="t", model="preset:tiny",
                          spec=FleetSpec(request=request, members=[])))
        session.commit()
        for job_id, (status, step) in ended.items():
            session.add(Job(id=job_id, tenant="t", status=status, model="preset:tiny",
                            memory_budget_bytes=1 << 30, config={}, training_file="d1",
                            step=step, fleet_id="fl-1" if job_id == "job-phone" else None))
            session.flush()
            session.add(Metric(job_id=job_id, step=step, loss=step / 10,
                               data={"val_loss": step / 5} if status == "succeeded" else {}))
            if status != "failed":
                session.add(Adapter(id=f"ad-{job_id}", job_id=job_id, path=f"/{job_id}",
                                    sha256=job_id[-1] * 64, bytes=step * 100))
        session.commit()
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    command.downgrade(config, "0016")
    command.upgrade(config, "head")
    with Session(engine) as session:
        rows = session.exec(select(JobCheckpoint).order_by(JobCheckpoint.job_id)).all()
        got = [(r.id, r.job_id, r.step, r.train_loss, r.valid_loss, r.path, r.sha256, r.bytes)
               for r in rows]
    engine.dispose()
    assert got == [(checkpoint_id("job-done", 3), "job-done", 3, 0.3, 0.6, "/job-done",
                    "e" * 64, 300),
                   (checkpoint_id("job-stopped", 2), "job-stopped", 2, 0.2, None,
                    "/job-stopped", "d" * 64, 200)]
