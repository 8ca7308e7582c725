"""``mebp worker``: serve the queue of a shared Redis, database and storage.

Run as many as the machines allow; each takes one job at a time. Only the job id crosses
Redis: the worker reads everything else from the database and the storage root.
"""

from __future__ import annotations

import os
import signal
import sys

from rq import Worker

from app.db import database_url, upgrade_database
from app.queue import connect, job_queue
from app.settings import Settings
from app.supervisor import SUPERVISOR_ENV
from mebp_core.proc import die_with_parent
from worker.memory_cap import remove_idle_caps


def work(settings: Settings, *, burst: bool = False) -> int:
    if settings.redis_url is None:
        print("mebp worker: REDIS_URL is not set (the Redis of the service to serve; "
              "`mebp serve` prints it)", file=sys.stderr)
        return 2
    if SUPERVISOR_ENV in os.environ:  # started by `mebp serve`: stop when it does
        die_with_parent(signal.SIGTERM, int(os.environ[SUPERVISOR_ENV]))
    settings.storage_root.mkdir(parents=True, exist_ok=True)
    remove_idle_caps()  # cgroups of jobs whose worker died on this host
    upgrade_database(database_url(settings.database_url, settings.data_dir))
    queue = job_queue(connect(settings.redis_url), settings.queue_name)
    print(f"mebp worker: serving queue {settings.queue_name!r}", file=sys.stderr, flush=True)
    Worker([queue], connection=queue.connection).work(burst=burst, logging_level="WARNING")
    return 0
