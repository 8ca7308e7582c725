"""The database: its URL, engines, and the Alembic migrations applied at start."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine
from sqlmodel import create_engine

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def database_url(explicit: str | None, data_dir: Path) -> str:
    """``DATABASE_URL`` when set, else SQLite inside the data directory."""
    return explicit or f"sqlite:///{Path(data_dir).resolve() / 'mebp.db'}"


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    connect_args = {"check_same_thread": False} if url.startswith("sqlite") else {}
    return create_engine(url, connect_args=connect_args, pool_pre_ping=True)


def upgrade_database(url: str) -> None:
    """Apply every migration not yet applied (idempotent)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = make_engine(url)
    command.upgrade(config, "head")
