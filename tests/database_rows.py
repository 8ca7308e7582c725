"""A migrated SQLite database for tests that write a job's rows straight: the dataset a job
names (a row with no file behind it) is already there."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.db import database_url, make_engine, upgrade_database
from service.models import Dataset


def database_with_dataset(directory: Path, *, rows: int) -> Engine:
    """A SQLite database in ``directory`` at the latest schema, holding dataset ``d1`` of
    tenant ``t`` with ``rows`` rows; its engine, for the caller to dispose."""
    url = database_url(None, directory)
    upgrade_database(url)
    engine = make_engine(url)
    with Session(engine) as session:
        session.add(Dataset(id="d1", tenant="t", filename="d.jsonl", path="/dev/null",
                            bytes=0, rows=rows, sha256="0" * 64))
        session.commit()
    return engine
