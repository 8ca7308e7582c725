"""``mebp serve``: the whole service on one machine, printing its URL and API key."""

from __future__ import annotations

import threading
from pathlib import Path

import uvicorn

from app.db import database_url, upgrade_database
from app.main import create_app
from app.settings import Settings
from mebp_core.cache import default_cache_dir
from mebp_core.plan.calibration import load_calibration


def upgrade(*, data_dir: Path | None) -> int:
    """``mebp db upgrade``: apply the migrations to ``DATABASE_URL`` or the data dir's SQLite."""
    settings = Settings(**({"data_dir": data_dir} if data_dir is not None else {}))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = database_url(settings.database_url, settings.data_dir)
    upgrade_database(url)
    print(f"mebp: database at {url.split('@')[-1]} is up to date")
    return 0


def serve(*, host: str | None, port: int | None, data_dir: Path | None) -> int:
    overrides = {k: v for k, v in (("host", host), ("port", port), ("data_dir", data_dir))
                 if v is not None}
    settings = Settings(**overrides)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(database_url(settings.database_url, settings.data_dir))
    # measure this host for the planner now, not on the first request
    threading.Thread(target=load_calibration, name="mebp-calibration", daemon=True,
                     args=(settings.cache_dir or default_cache_dir(), settings.threads)).start()
    print(f"mebp: serving on http://{settings.host}:{settings.port} "
          f"(OpenAPI at /docs); API key: {settings.api_key}", flush=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level="info")
    return 0
