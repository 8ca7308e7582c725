"""The migrations build every table on SQLite and on the machine's real PostgreSQL, and a
second upgrade is a no-op."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from sqlalchemy import inspect, text

from app.db import database_url, make_engine, upgrade_database

TABLES = {"api_keys", "devices", "datasets", "fleets", "jobs", "events", "metrics", "adapters",
          "alembic_version"}
POSTGRES_ADMIN = os.environ.get("MEBP_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def assert_schema(url: str) -> None:
    engine = make_engine(url)
    try:
        names = set(inspect(engine).get_table_names())
        assert TABLES <= names, TABLES - names
        columns = {c["name"] for c in inspect(engine).get_columns("jobs")}
        assert {"status", "config", "plan", "enforcement", "error_code", "memory_budget_bytes",
                "peak_anon_bytes", "idempotency_key", "metadata"} <= columns
        with engine.connect() as connection:
            version = connection.execute(text("select version_num from alembic_version"))
            assert version.scalar_one() == "0001"
    finally:
        engine.dispose()


def test_sqlite_in_the_data_dir_by_default(tmp_path):
    url = database_url(None, tmp_path)
    assert url == f"sqlite:///{tmp_path.resolve() / 'mebp.db'}"
    upgrade_database(url)
    upgrade_database(url)  # idempotent
    assert_schema(url)


@pytest.fixture
def postgres_url():
    """A fresh database on the machine's PostgreSQL, dropped afterwards."""
    name = f"mebp_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    yield POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'drop database "{name}" with (force)')


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
