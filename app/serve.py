"""``mebp serve``: the whole service on one machine (API, workers, and an embedded Redis when
``REDIS_URL`` is unset; workers and Redis restarted when they exit), printing its URL and API
key, stopped whole by SIGTERM or SIGINT (``app.stopping``); ``mebp keys`` and ``mebp db``.
``mebp worker`` is the worker package's own command."""

from __future__ import annotations

import signal
from pathlib import Path

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from app.connection_guard import connection_limits, guarded_protocol, raise_descriptor_limit
from app.keys import bootstrap_key
from app.stopping import GRACEFUL_S, ServiceStop, StoppingServer
from service.db import database_url, upgrade_database
from service.queue import EmbeddedRedis
from service.settings import load_settings
from service.supervisor import WorkerPool


def upgrade(*, data_dir: Path | None) -> int:
    """``mebp db upgrade``: apply the migrations to ``DATABASE_URL`` or the data dir's SQLite."""
    settings = load_settings(data_dir=data_dir)
    url = database_url(settings.database_url, settings.data_dir)
    upgrade_database(url)
    print(f"mebp: database at {url.split('@')[-1]} is up to date")
    return 0


def serve(*, host: str | None, port: int | None, data_dir: Path | None,
          workers: int | None = None) -> int:
    stop = ServiceStop()
    for number in (signal.SIGTERM, signal.SIGINT):  # until uvicorn takes them over, and after
        signal.signal(number, stop.on_signal)
    settings = load_settings(host=host, port=port, data_dir=data_dir, workers=workers)
    key, key_source = bootstrap_key(settings)
    settings = settings.model_copy(update={"api_key": key})
    upgrade_database(database_url(settings.database_url, settings.data_dir))
    try:
        if settings.redis_url is None:
            stop.redis = EmbeddedRedis(settings.data_dir)
            settings = settings.model_copy(update={"redis_url": stop.redis.url})
        stop.workers = WorkerPool(settings)
        print(f"mebp: serving on http://{settings.host}:{settings.port} (OpenAPI at /docs) "
              f"with {settings.workers} worker(s), Redis at {settings.redis_url}; "
              f"API key: {settings.api_key} (from {key_source})", flush=True)
        # imported once the workers are starting: its imports (torch among them, 2-3 s)
        # then run beside theirs, not before them
        from app.main import create_app

        limits = raise_descriptor_limit(connection_limits(settings))
        app = create_app(settings)
        server = StoppingServer(
            uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                           http=guarded_protocol(limits),
                           h11_max_incomplete_event_size=limits.max_header_bytes,
                           timeout_graceful_shutdown=GRACEFUL_S),
            on_signal=stop.begin, end_streams=app.state.event_hub.end_streams)
        server.run()
    finally:
        stop.finish()
        if stop.signal_number:  # also when it came before uvicorn ran
            stop.exit(0)
    stop.exit(0 if server.started else STARTUP_FAILURE)  # as uvicorn.run: the address taken
