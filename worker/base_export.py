"""A base export, as the exports worker runs it (RQ names ``make_base`` by string): in the
work horse, under a lease the API reads to tell a running export from one whose worker was
killed, with everything it needs in its arguments (the target's file name and the cache
bound, as the API computed them: no setting of this host's can disagree). An error is
recorded for the API to report, not raised; the horse is the first the kernel's OOM killer
takes (``oom_score_adj`` 1000), beside the capped engines of this host's training jobs.
Not yet under a cap of worker/memory_cap: a bound (predicted export bytes, plus the largest
tensor dequantized, plus the runtime's slack) would cover writing, but the same run may pack
the model first (``resolve_model``), whose peak has no prediction yet."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from rq import get_current_job

from mebp_core.cache import default_cache_dir
from service.base_export_queue import (
    end_run,
    holding_lease,
    lease_key,
    marker_key,
    record_failure,
    requeue_run,
)
from service.bases import BaseRequest
from service.bases import make_base as make_kept_base
from service.settings import load_settings
from service.storage import bases_dir

log = logging.getLogger("mebp")
OOM_SCORE_ADJ = Path("/proc/self/oom_score_adj")


def make_base(fields: dict, target_name: str, max_cache_bytes: int) -> str | None:
    """Make (unless kept) the export ``fields`` describe at ``target_name``; the name of the
    kept file, or None if it failed (why is recorded) or another run makes it."""
    settings = load_settings()
    request = BaseRequest(**fields)
    job = get_current_job()
    marker = job.connection.get(marker_key(settings.queue_name, target_name))
    if marker is None or marker.decode().split()[0] != job.id:
        return None  # a run the API replaced (its lease lapsed): the newer one makes it
    OOM_SCORE_ADJ.write_text("1000")  # not the engines': their caps hold them
    path = bases_dir(settings.storage_root) / target_name
    with holding_lease(job.connection, lease_key(settings.queue_name, job.id)):
        try:
            made = make_kept_base(request, path, settings.cache_dir or default_cache_dir(),
                                  max_cache_bytes)
        except Exception as exc:  # the export's own failure: told once, tried again after
            log.warning("base export %s failed: %s", job.id, exc)
            record_failure(job.connection, settings.queue_name, target_name, str(exc))
            made = None
        else:
            if made is None:  # another run on this host holds its lock: it ends the marker
                return None
    end_run(job.connection, settings.queue_name, target_name, job.id)
    return made.name if made is not None else None


def oom_kills() -> int:
    """The kernel's OOM kills on this host so far."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return int(value)
    return 0


def horse_died(job, queue_name: str, *, stopping: bool, signal_number: int | None,
               oom_kills_before: int) -> None:
    """The export ``job``'s horse died: ended by a stop signal, it is queued again at once
    (not the export's fault, and counted nowhere); ended by the OOM killer, it is a failure
    saying so (made again only when asked again); killed otherwise, it is lost, and queued
    again by the next request that may start it."""
    if stopping:
        requeue_run(job, queue_name)
        return
    if signal_number == signal.SIGKILL and oom_kills() > oom_kills_before:
        _, target_name, _ = job.args
        record_failure(job.connection, queue_name, target_name, (
            "the kernel's OOM killer ended the export: this host ran out of memory (the "
            "export has no memory cap of its own and is the first process killed); free "
            "memory on the worker hosts, or ask for a smaller format, then ask again"))
        end_run(job.connection, queue_name, target_name, job.id)
