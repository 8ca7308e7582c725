"""Alembic environment: the engine comes from ``service.db.upgrade_database`` (or the URL given
with ``-x url=...`` on the alembic command line); the target is the SQLModel metadata."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import service.models  # noqa: F401 (registers the tables on SQLModel.metadata)
from service.db import make_engine

config = context.config
engine = config.attributes.get("engine") or make_engine(context.get_x_argument(True)["url"])

MIGRATION_LOCK = 0x6D656270  # "mebp": one migrator at a time when several services start

with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=SQLModel.metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":  # released when the transaction ends
            connection.exec_driver_sql(f"select pg_advisory_xact_lock({MIGRATION_LOCK})")
        context.run_migrations()
