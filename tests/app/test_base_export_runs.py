"""One run per export, counted once, and nothing left behind: over the machine's Redis with the
app in process (no worker: each test plays the worker's part itself). Starting is atomic (a
start racing another joins it, its quota uncounted); a lost run is queued again only by a
start, under a fresh RQ id, never by a page or listing that only looks; the run carries its
target and cache bound; one the OOM killer ended fails saying so, not retried unasked;
the maker never waits on another's lock, nor eviction for long on a turn whose holder hangs;
eviction leaves a grave an open download still reads, and no lock or half-made digest behind."""

from __future__ import annotations

import os
import signal
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from hung_lock import finishes, held_by_a_hung_process
from rq import Queue
from rq.job import JobStatus

from mebp_core.atomic import exclusive_lock
from service import base_cache
from service.base_cache import evict_least_recently_served, eviction_lock_path, lock_path
from service.base_export_queue import exports_queue_name, holding_lease
from service.bases import BaseRequest, base_target, is_kept, make_base
from service.queue import connect
from service.storage import digest_path
from worker.base_export import horse_died, oom_kills

REQUEST = BaseRequest("preset:tiny", "int4", 64, "gguf", "float32", "q8_0")
BASE = "/v1/models/preset:tiny/base"
PARAMS = {"format": "gguf", "quant": "q8_0"}


def exports_of(api):
    return api.client.app.state.base_exports


def exports_queue(api) -> Queue:
    settings = api.client.app.state.settings
    return Queue(exports_queue_name(settings.queue_name), connection=connect(settings.redis_url))


@pytest.fixture
def empty_queue(api):
    queue = exports_queue(api)
    queue.empty()
    yield queue
    queue.empty()
    for key in queue.connection.keys(f"{api.client.app.state.settings.queue_name}:base-export*"):
        queue.connection.delete(key)


def test_a_start_racing_another_joins_it_and_counts_nothing(api, empty_queue):
    exports = exports_of(api)
    admitted, entered, others_done = [], threading.Event(), threading.Event()

    def admit() -> None:
        admitted.append(threading.current_thread().name)
        if len(admitted) == 1:  # the first start holds here, between its check and its queue
            entered.set()
            assert others_done.wait(60)

    first = threading.Thread(target=exports.start, args=(REQUEST, admit), name="first")
    first.start()
    assert entered.wait(60)
    for _ in range(3):
        exports.start(REQUEST, admit)
    others_done.set()
    first.join(60)
    assert admitted == ["first"]  # the quota counted once
    assert empty_queue.count == 1  # one run


def lose(job) -> None:
    """As if the worker running ``job`` was SIGKILLed: started long ago, no lease, no horse."""
    queue = Queue(job.origin, connection=job.connection)
    queue.remove(job)
    job.started_at = datetime.now(UTC) - timedelta(minutes=5)
    job.set_status(JobStatus.STARTED)
    job.save()


def test_a_lost_run_is_queued_again_by_a_start_alone_under_a_fresh_id(api, empty_queue):
    assert api.client.get(BASE, params=PARAMS).status_code == 202
    [job] = empty_queue.jobs
    lose(job)
    listed = api.client.get(BASE + "/formats").json()["data"]
    [entry] = [e for e in listed if e["format"] == "gguf" and e["quant"] == "q8_0"]
    assert entry["status"] == "not_exported"
    assert not exports_of(api).exporting(REQUEST)  # the page's look
    assert empty_queue.count == 0  # looking queues nothing
    assert api.client.get(BASE, params=PARAMS).status_code == 202  # the key starts it again
    [again] = empty_queue.jobs
    assert again.id != job.id  # RQ's clean-up of the lost run cannot touch this one


def test_the_run_carries_its_target_and_the_cache_bound(api, empty_queue):
    assert api.client.get(BASE, params=PARAMS).status_code == 202
    [job] = empty_queue.jobs
    settings = api.client.app.state.settings
    _, target_name, max_cache_bytes = job.args
    assert target_name == exports_of(api).target(REQUEST).name
    assert max_cache_bytes == settings.max_base_cache_bytes


class RedisAway:
    """A connection to a Redis that went away after the lease was first taken."""

    def set(self, *args, **kwargs) -> None:
        pass

    def delete(self, *keys) -> None:
        raise redis.ConnectionError("Redis is away")


def test_a_lease_released_while_redis_is_away_lapses_without_failing_the_export():
    with holding_lease(RedisAway(), "lease"):
        pass  # made


def test_a_maker_never_waits_on_another_makers_lock(tmp_path, model_cache):
    path = base_target(REQUEST, tmp_path, model_cache)
    path.parent.mkdir(parents=True)
    with exclusive_lock(lock_path(path)):  # another maker on this host, making it
        assert make_base(REQUEST, path, model_cache, max_cache_bytes=1 << 30) is None
    assert not path.exists()


def test_a_killed_makers_leftovers_are_removed_and_eviction_leaves_a_readable_grave(
        tmp_path, model_cache):
    path = base_target(REQUEST, tmp_path, model_cache)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"whole, but killed before its digest")  # uncounted: not kept
    staged_digest = path.with_name(f".{digest_path(path).name}.tmp-abc123")
    staged_digest.write_text("half")
    assert make_base(REQUEST, path, model_cache, max_cache_bytes=1 << 30) == path
    assert is_kept(path) and not staged_digest.exists()
    assert path.read_bytes()[:4] == b"GGUF"

    other = BaseRequest("preset:tiny", "int4", 64, "gguf", "float32", "q4_1")
    download = open(path, "rb")  # a download of the first, as the API holds it
    os.utime(digest_path(path), (0, 0))  # least recently served
    made = make_base(other, base_target(other, tmp_path, model_cache), model_cache,
                     max_cache_bytes=0)  # room for none: the first is evicted
    assert made is not None and not path.exists() and not lock_path(path).exists()
    [grave] = list(path.parent.glob(f".{path.name}.grave-*"))
    assert os.fstat(download.fileno()).st_ino == grave.stat().st_ino  # renamed, not unlinked
    assert download.read(4) == b"GGUF"
    download.close()
    assert not [p for p in Path(path.parent).iterdir() if ".tmp-" in p.name]


def test_an_export_is_made_though_an_evictor_hangs_holding_its_turn(tmp_path, model_cache,
                                                                    monkeypatch):
    """Another worker hung (stopped, never to go on) while it evicted: the next export is
    made and kept, its eviction skipped after ``EVICTION_WAIT_S`` (what is beyond the bound
    stays); with the turn free, eviction removes it."""
    monkeypatch.setattr(base_cache, "EVICTION_WAIT_S", 0.5)
    first = base_target(REQUEST, tmp_path, model_cache)
    assert make_base(REQUEST, first, model_cache, max_cache_bytes=1 << 30) == first
    other = BaseRequest("preset:tiny", "int4", 64, "gguf", "float32", "q4_1")
    second = base_target(other, tmp_path, model_cache)
    with held_by_a_hung_process(eviction_lock_path(first.parent)) as holder:
        made, waited_s = finishes(lambda: make_base(other, second, model_cache,
                                                    max_cache_bytes=0))
        assert holder.poll() is None  # it held the turn throughout
    assert made == second and waited_s >= 0.5
    assert is_kept(first) and is_kept(second)  # beyond the bound: nothing evicted
    assert evict_least_recently_served(first.parent, 0, keep=second) == [first]
    assert not first.exists() and is_kept(second)


def test_an_export_the_oom_killer_ended_fails_saying_so_and_is_not_retried_unasked(
        api, empty_queue):
    assert api.client.get(BASE, params=PARAMS).status_code == 202
    [job] = empty_queue.jobs
    empty_queue.remove(job)  # taken by the exports worker, whose horse the kernel killed
    queue_name = api.client.app.state.settings.queue_name
    horse_died(job, queue_name, stopping=False, signal_number=signal.SIGKILL,
               oom_kills_before=oom_kills() - 1)
    assert empty_queue.count == 0  # no blind retry
    failed = api.client.get(BASE, params=PARAMS)
    assert failed.status_code == 500 and "OOM killer" in failed.json()["detail"], failed.text
    assert api.client.get(BASE, params=PARAMS).status_code == 202  # asked again: tried again
    assert empty_queue.count == 1
