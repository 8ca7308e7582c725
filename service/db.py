"""The database: its URL, engines, and the Alembic migrations applied at start."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, event
from sqlmodel import create_engine

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def database_url(explicit: str | None, data_dir: Path) -> str:
    """``DATABASE_URL`` when set, else SQLite inside the data directory."""
    return explicit or f"sqlite:///{Path(data_dir).resolve() / 'mebp.db'}"


SQLITE_BUSY_TIMEOUT_S = 30
POOL_SIZE, POOL_OVERFLOW = 5, 10  # connections kept, and opened on demand beyond them
POOL_CONNECTIONS = POOL_SIZE + POOL_OVERFLOW


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    pool = {"pool_pre_ping": True, "pool_size": POOL_SIZE, "max_overflow": POOL_OVERFLOW}
    if not url.startswith("sqlite"):
        return create_engine(url, **pool)
    # the API, the workers and the reconciler write at once: wait for the lock rather than
    # fail, and let readers go on beside a writer (WAL)
    engine = create_engine(url, **pool, connect_args={
        "check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S})
    event.listen(engine, "connect", _sqlite_wal)
    return engine


def _sqlite_wal(connection, record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def upgrade_database(url: str) -> None:
    """Apply every migration not yet applied (idempotent)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = make_engine(url)
    command.upgrade(config, "head")
