"""Attacks on long histories (issue 29, finding 2), against a real `mebp serve` on both
deployments: an event stream used to read its job's whole history before its first message,
so sixteen streams on a 200,000-step job took minutes to start, grew the API to 9.8 GB and
stalled `/v1/health` for up to 120 s; `GET /metrics` answered all 200,000 rows (69 MB) in
one response.

The service has no worker, so the jobs stay queued; their histories are written straight
into the service's database, in bulk, as a worker would have recorded them."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import httpx
import psutil
import psycopg
import pytest
from service_harness import (
    Service,
    deployed_service,
)
from test_attacks_streams import async_client, make_keys, timed_get

from service.db import make_engine
from service.models import Metric

LONG_STEPS = 200_000
SHORT_STEPS, SHORT_EVENTS = 2_345, 1_234  # a few pages of each, with a partial last one
STREAMS = 16  # the default MEBP_MAX_STREAMS_PER_KEY
MB = 1 << 20
RSS_GROWTH_BYTES = 150 * MB  # was 9.8 GB; a page per stream is well under 1 MB
ROWS = b"".join(json.dumps({"text": f"row {i} of a dataset"}).encode() + b"\n"
                for i in range(8))
JOB = {"model": "preset:tiny", "device": "iphone-15-pro-max",
       "hyperparameters": {"steps": 4, "seq_len": 64}}
START = datetime(2026, 1, 1, tzinfo=UTC)


def step_figures(step: int) -> dict:
    """What a worker records beside each step's loss (about 350 bytes a row, as measured)."""
    return {"step_time_s": 0.41 + step % 7 / 100, "peak_mb": 412.7, "peak_anon_mb": 398.2,
            "footprint_mb": 455.1, "file_mb": 61.3, "cgroup_usage_peak_mb": 470.4,
            "decompress_s": 0.12, "tokens": 256, "lr": 1e-4, "grad_norm": 0.83,
            "predicted_step_time_s": 0.44, "predicted_peak_mb": 430.0}


def record_history(url: str, job_id: str, steps: int, events: int = 0) -> None:
    """``steps`` metrics (then ``events`` log events) of ``job_id``, written in bulk: COPY
    into PostgreSQL, one executemany into SQLite."""
    figures = [json.dumps(step_figures(step)) for step in range(7)]  # by step % 7
    metrics = [(job_id, step, 5.0 / step ** 0.1, figures[step % 7],
                START + timedelta(seconds=step)) for step in range(1, steps + 1)]
    logs = [(job_id, "log", f"log line {n}", "{}", START + timedelta(seconds=n))
            for n in range(events)]
    if url.startswith("postgresql"):
        with psycopg.connect(url) as connection, connection.cursor() as cursor:
            with cursor.copy("copy metrics (job_id, step, loss, data, at) from stdin") as copy:
                for row in metrics:
                    copy.write_row(row)
            with cursor.copy("copy events (job_id, kind, message, data, at) from stdin") as copy:
                for row in logs:
                    copy.write_row(row)
        return
    engine = make_engine(url)
    to_sqlite = Metric.__table__.c.at.type.bind_processor(engine.dialect)
    try:
        with engine.begin() as connection:
            for table, rows in (("metrics (job_id, step, loss, data, at)", metrics),
                                ("events (job_id, kind, message, data, at)", logs)):
                if rows:
                    connection.exec_driver_sql(f"insert into {table} values (?, ?, ?, ?, ?)",
                                               [(*row[:4], to_sqlite(row[4])) for row in rows])
    finally:
        engine.dispose()


@pytest.fixture(scope="module", params=["embedded", "shared"])
def history_service(request, tmp_path_factory, model_cache) -> Iterator[tuple[Service, str]]:
    """A service without workers, its database URL, and a queued job of 200,000 steps."""
    root = tmp_path_factory.mktemp(f"histories-{request.param}")
    with ExitStack() as stack:
        service, url = stack.enter_context(
            deployed_service(request.param, root, model_cache, {}, workers=0))
        status, dataset = service.upload("rows.jsonl", ROWS)
        assert status == 201, dataset
        service.dataset_id = dataset["id"]
        service.long_job = queued_job(service, stack)
        record_history(url, service.long_job, LONG_STEPS)
        yield service, url


def queued_job(service: Service, stack: ExitStack) -> str:
    """A job that stays queued (no worker), cancelled when ``stack`` closes."""
    status, job = service.request("POST", "/v1/jobs",
                                  {**JOB, "training_file": service.dataset_id})
    assert status == 201 and job["status"] == "queued", job
    stack.callback(service.request, "POST", f"/v1/jobs/{job['id']}/cancel")
    return job["id"]


@pytest.fixture
def short_job(history_service) -> Iterator[str]:
    """A cancelled job of a few pages of metrics and events: its streams replay and end."""
    service, url = history_service
    with ExitStack() as stack:
        job_id = queued_job(service, stack)
        record_history(url, job_id, SHORT_STEPS, SHORT_EVENTS)
        status, job = service.request("POST", f"/v1/jobs/{job_id}/cancel")
        assert status == 200 and job["status"] == "cancelled", job
        stack.pop_all()
        yield job_id


class Watch:
    """The API process's RSS above where it started, and health's answer times, sampled
    while an attack runs; ``over`` is set once the RSS grew past ``RSS_GROWTH_BYTES``, so
    the attack stops before the old code's gigabytes."""

    def __init__(self, service: Service) -> None:
        self.process = psutil.Process(service.process.pid)
        self.service = service
        self.start_bytes = self.process.memory_info().rss
        self.peak_growth_bytes = 0
        self.health_s: list[float] = []
        self.answered = asyncio.Event()  # health answered at least once
        self.over = asyncio.Event()

    async def rss(self) -> None:
        while True:
            growth = self.process.memory_info().rss - self.start_bytes
            self.peak_growth_bytes = max(self.peak_growth_bytes, growth)
            if growth > RSS_GROWTH_BYTES:
                self.over.set()
            await asyncio.sleep(0.05)

    async def health(self) -> None:
        while True:
            self.health_s.append(await asyncio.to_thread(timed_get, self.service, "/v1/health"))
            self.answered.set()
            await asyncio.sleep(0.2)

    def report(self) -> str:
        return (f"RSS +{self.peak_growth_bytes / MB:.0f} MB, health s: "
                f"{sorted(round(s, 3) for s in self.health_s)[-5:]} of {len(self.health_s)}")


async def read_stream(client: httpx.AsyncClient, job_id: str, key: str, messages: int,
                      first: asyncio.Queue) -> list[tuple[str, dict]]:
    """The stream's first ``messages`` (event, data); ``first`` gets the seconds to the first."""
    started = time.perf_counter()
    received: list[tuple[str, dict]] = []
    headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
    async with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        kind = None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                received.append((kind, json.loads(line.removeprefix("data: "))))
                if len(received) == 1:
                    first.put_nowait(time.perf_counter() - started)
                if len(received) == messages or kind == "end":
                    break
    return received


async def attack(watch: Watch, tasks: list[asyncio.Task], timeout_s: float) -> list:
    """Runs ``tasks`` beside the watch; stops them all when the RSS grows past its bound."""
    samplers = [asyncio.create_task(watch.rss()), asyncio.create_task(watch.health())]
    over = asyncio.create_task(watch.over.wait())
    try:
        done, _ = await asyncio.wait([asyncio.gather(*tasks), over], timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        assert not watch.over.is_set(), f"the API grew past its bound: {watch.report()}"
        assert done, f"not done in {timeout_s} s: {watch.report()}"
        # the health request sent as the attack started answers (the attack may end first)
        await asyncio.wait_for(watch.answered.wait(), timeout_s)
        return [task.result() for task in tasks]
    finally:
        for task in [*tasks, *samplers, over]:
            task.cancel()
        await asyncio.gather(*tasks, *samplers, over, return_exceptions=True)


@pytest.mark.slow
def test_streams_on_a_long_history_start_at_once_and_hold_a_page(history_service):
    """Sixteen streams from the start of 200,000 steps: each reads 1,200 metrics (across
    three catch-up pages) as fast as it can."""
    service, _ = history_service
    watch = Watch(service)

    async def run() -> tuple[list, list[float]]:
        first: asyncio.Queue = asyncio.Queue()
        async with async_client(service) as client:
            tasks = [asyncio.create_task(read_stream(client, service.long_job,
                                                     service.api_key, 1_200, first))
                     for _ in range(STREAMS)]
            streams = await attack(watch, tasks, timeout_s=60)
        return streams, [first.get_nowait() for _ in range(first.qsize())]

    streams, first_s = asyncio.run(run())
    print(f"16 streams of {LONG_STEPS} steps: first metric after {sorted(first_s)} s; "
          f"{watch.report()}")
    for messages in streams:
        assert [kind for kind, _ in messages] == ["metric"] * 1_200
        assert [data["step"] for _, data in messages] == list(range(1, 1_201))
    assert max(first_s) < 10, first_s  # was 2-4 minutes
    assert watch.peak_growth_bytes < RSS_GROWTH_BYTES, watch.report()
    assert max(watch.health_s) < 5 and statistics.median(watch.health_s) < 1, watch.report()


@pytest.mark.slow
def test_200_streams_opened_at_once_on_a_long_history_leave_health_fast(history_service):
    """Two hundred streams over thirteen keys, each waiting for its first metric, then
    holding its connection without reading while health is probed."""
    service, url = history_service
    keys = [key for key in make_keys(url, 13) for _ in range(STREAMS)][:200]
    watch = Watch(service)

    async def run() -> list[float]:
        first: asyncio.Queue = asyncio.Queue()
        async with async_client(service) as client:
            held = asyncio.Event()

            async def hold(key: str) -> None:  # one message, then a client that stalls
                async with client.stream("GET", f"/v1/jobs/{service.long_job}/events",
                                         headers={"Authorization": f"Bearer {key}",
                                                  "Accept": "text/event-stream"}) as response:
                    assert response.status_code == 200, await response.aread()
                    started = time.perf_counter()
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            first.put_nowait(time.perf_counter() - started)
                            break
                    await held.wait()

            tasks = [asyncio.create_task(hold(key)) for key in keys]

            async def opened() -> None:
                while first.qsize() < len(keys):
                    await asyncio.sleep(0.1)
                await asyncio.sleep(3)  # the stalled streams fill their sockets meanwhile
                held.set()

            await attack(watch, [*tasks, asyncio.create_task(opened())], timeout_s=90)
        return [first.get_nowait() for _ in range(first.qsize())]

    first_s = asyncio.run(run())
    print(f"200 streams of {LONG_STEPS} steps: first metric after {max(first_s):.2f} s; "
          f"{watch.report()}")
    assert len(first_s) == 200
    assert max(watch.health_s) < 5 and statistics.median(watch.health_s) < 1, watch.report()


def test_metrics_come_in_pages_with_a_link_to_the_next(history_service):
    service, _ = history_service
    path = f"/v1/jobs/{service.long_job}/metrics"
    started = time.perf_counter()
    response = service.client.get(path)
    assert time.perf_counter() - started < 5  # was 13.6 s for 69 MB
    page = response.json()
    assert response.status_code == 200 and page["count"] == 1000, page["count"]
    assert [row["step"] for row in page["data"]] == list(range(1, 1001))
    assert page["data"][0]["data"] == step_figures(1)
    following = response.links["next"]["url"]
    assert page["next"] == following
    assert dict(httpx.URL(following).params) == {"after": "1000", "limit": "1000"}
    last = service.client.get(path, params={"after": LONG_STEPS - 700, "limit": 10_000})
    assert last.status_code == 200 and last.json()["count"] == 700
    assert last.json()["next"] is None and "link" not in last.headers
    for params in ({"limit": 10_001}, {"limit": 0}, {"after": -1}, {"after": 10 ** 20},
                   {"after": "x"}):
        refused = service.client.get(path, params=params)
        assert refused.status_code == 422, (params, refused.text)
        assert [error["loc"] for error in refused.json()["detail"]] == [
            ["query", next(iter(params))]]


def test_a_walk_along_the_links_reads_every_row_once(history_service, short_job):
    service, _ = history_service
    steps, url = [], f"/v1/jobs/{short_job}/metrics?limit=1000"
    while url is not None:
        page = service.client.get(url).json()
        steps += [row["step"] for row in page["data"]]
        url = page["next"]
    assert steps == list(range(1, SHORT_STEPS + 1))

    events, response = [], service.client.get(f"/v1/jobs/{short_job}/events",
                                              params={"limit": 500})
    while True:
        assert response.status_code == 200
        events += response.json()
        if "next" not in response.links:
            break
        response = service.client.get(response.links["next"]["url"])
    ids = [event["id"] for event in events]
    assert ids == sorted(set(ids)) and len(ids) == 2 + SHORT_EVENTS + 1  # + its statuses
    assert sum(event["kind"] == "log" for event in events) == SHORT_EVENTS
    first_page = service.job_events(short_job)
    assert len(first_page) == 1000 and first_page == events[:1000]


def test_a_stream_replays_its_pages_in_order_and_resumes_mid_history(history_service,
                                                                      short_job):
    service, _ = history_service

    def replay(last_event_id: str | None = None) -> list[tuple[str, str, dict]]:
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        messages, cursor, kind = [], None, None
        with service.client.stream("GET", f"/v1/jobs/{short_job}/events",
                                   headers=headers) as response:
            for line in response.iter_lines():
                if line.startswith("id: "):
                    cursor = line.removeprefix("id: ")
                elif line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    messages.append((cursor, kind, json.loads(line.removeprefix("data: "))))
        return messages

    messages = replay()
    kinds = [kind for _, kind, _ in messages]
    # every metric, then every event, then the end: as one read used to give them
    assert kinds == (["metric"] * SHORT_STEPS + ["status", "status"] + ["log"] * SHORT_EVENTS
                     + ["status", "end"])
    assert [data["step"] for _, kind, data in messages if kind == "metric"] == list(
        range(1, SHORT_STEPS + 1))
    assert messages[-1][2] == {"status": "cancelled"}
    middle = 1_500  # inside the fourth catch-up page (100, then 500 a page)
    assert replay(messages[middle - 1][0]) == messages[middle:]
