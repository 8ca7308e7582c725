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
