"""Attacks on the base exports (issue 29, item 4), against real `mebp serve` processes on both
deployments (the shared one as two API processes over one PostgreSQL, Redis and storage):
one key made 39 distinct exports in 5 minutes, none ever removed; a cross-origin GET carrying
only the dashboard's cookie started one; `group_size=9` was a 500, then a 202. Each API
process has a worker: the exports are made there (service/base_export_queue.py).

Every export here is of the tiny preset (about 6.5 MB at 16 bits), packed at group sizes 32
and 64 only. Each test makes its own combinations and waits for its exports, so none is
being made behind another test's back (the LRU order below depends on it)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from service_harness import (
    API_KEY,
    REDIS_TEST_URL,
    Service,
    start_service,
    stop_service,
    temporary_postgres_database,
    tiny_job,
)
from sqlmodel import Session

from app.keys import create_key
from mebp_core.plan.arch import load_architecture
from service.db import database_url, make_engine

QUOTA = 1
# room for two 16-bit exports of the tiny preset, not three (checked where it matters)
CACHE_BYTES = 5 * load_architecture("preset:tiny").parameter_count()
COOKIE = "mebp_session"
BASE = "/v1/models/preset:tiny/base"
NEVER_MADE = {"format": "hf", "dtype": "float32", "group_size": 32}  # no test makes it
ROWS = b'{"text": "a base for every adapter"}\n' * 8


@dataclass
class Deployment:
    services: list[Service]  # API processes sharing a database, Redis and storage
    database: str
    bases: Path  # where the kept exports are

    def client(self, tenant: str, index: int = 0) -> httpx.Client:
        """A client of API process ``index`` with a new key of ``tenant``."""
        engine = make_engine(self.database)
        try:
            with Session(engine) as session:
                key = create_key(session, tenant=tenant)
        finally:
            engine.dispose()
        return httpx.Client(base_url=self.services[index].url, timeout=60,
                            headers={"Authorization": f"Bearer {key}"})


ENV = {"MEBP_MAX_BASE_EXPORTS_PER_TENANT_PER_HOUR": str(QUOTA),
       "MEBP_MAX_BASE_CACHE_BYTES": str(CACHE_BYTES)}


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, model_cache) -> Iterator[Deployment]:
    """One `mebp serve` with SQLite and its embedded Redis."""
    root = tmp_path_factory.mktemp("exports-embedded")
    service = start_service(root, model_cache, ENV, workers=1)
    yield Deployment([service], database_url(None, root / "data"),
                     root / "data" / "storage" / "bases")
    stop_service(service)


@pytest.fixture(scope="module")
def shared(tmp_path_factory, model_cache) -> Iterator[Deployment]:
    """Two `mebp serve` processes over one PostgreSQL, Redis and storage dir."""
    root = tmp_path_factory.mktemp("exports-shared")
    with ExitStack() as stack:
        url = stack.enter_context(temporary_postgres_database())
        env = ENV | {"DATABASE_URL": url, "REDIS_URL": REDIS_TEST_URL,
                     "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}",
                     "MEBP_STORAGE_DIR": str(root / "storage")}
        services = []
        for name in ("a", "b"):
            services.append(start_service(root / name, model_cache, env, workers=1))
            stack.callback(stop_service, services[-1])
        yield Deployment(services, url, root / "storage" / "bases")


@pytest.fixture(params=["embedded", "shared"])
def deployment(request) -> Deployment:
    return request.getfixturevalue(request.param)


def served(client: httpx.Client, timeout_s: float = 180, **params) -> httpx.Response:
    """The export, asked again while it is being made (started by the first ask)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = client.get(BASE, params=params)
        if response.status_code != 202:
            assert response.status_code == 200, response.text
            return response
        assert time.monotonic() < deadline, f"{params} not exported in {timeout_s} s"
        time.sleep(0.2)


def sign_in(service: Service, key: str = API_KEY) -> str:
    with httpx.Client(base_url=service.url, timeout=60) as browser:
        response = browser.post("/signin", data={"api_key": key},
                                headers={"Origin": service.url})
    assert response.status_code == 303, response.text
    return response.cookies[COOKIE]


def browser(service: Service, cookie: str, origin: str | None = None) -> httpx.Client:
    """A signed-in browser's requests: the cookie, no key, redirects not followed."""
    headers = {"Cookie": f"{COOKIE}={cookie}"}
    if origin is not None:
        headers["Origin"] = origin
    return httpx.Client(base_url=service.url, timeout=60, headers=headers)


def in_the_making(bases: Path) -> list[str]:
    """Exports being made or kept (staging directories and files included)."""
    return sorted(p.name for p in bases.iterdir()) if bases.is_dir() else []


def test_export_parameters_are_refused_before_anything_runs(deployment, model_cache):
    service = deployment.services[0]
    for params, field, says in (
            ({"group_size": 9}, "group_size", "power of two"),
            ({"group_size": 4}, "group_size", "8"),
            ({"group_size": 8192}, "group_size", "4096"),
            ({"group_size": "64.5"}, "group_size", "integer"),
            ({"quant": "int3"}, "quant", "int4"),
            ({"dtype": "float64"}, "dtype", "float32"),
            ({"format": "safetensors"}, "format", "gguf"),
            ({"format": "gguf", "dtype": "bfloat16"}, "dtype", "float16")):
        response = service.client.get(BASE, params=params)
        assert response.status_code == 422, (params, response.text)
        [error] = response.json()["detail"]
        assert error["loc"] == ["query", field] and says in error["msg"], (params, error)
    # nothing was packed for group_size 9, and no export began
    assert not list(model_cache.glob("preset-tiny-*-g9-*"))
    assert not [name for name in in_the_making(deployment.bases) if "-g9-" in name]


def test_a_cookie_alone_never_starts_an_export_but_downloads_a_made_one(deployment):
    service = deployment.services[0]
    with deployment.client("cookie-tenant") as api:
        key = api.headers["Authorization"].removeprefix("Bearer ")
        made = served(api, format="hf", dtype="float16", group_size=32)
    before = in_the_making(deployment.bases)
    cookie = sign_in(service, key)
    # a page on another port of this host sends the cookie with its GET (same site)
    with browser(service, cookie, origin="http://127.0.0.1:1") as foreign:
        for _ in range(2):
            response = foreign.get(BASE, params=NEVER_MADE)
            assert response.status_code == 409, response.text
            assert "job's page" in response.json()["detail"]
        assert in_the_making(deployment.bases) == before  # nothing staged, nothing made
        again = foreign.get(BASE, params={"format": "hf", "dtype": "float16",
                                          "group_size": 32})
    assert again.status_code == 200 and again.content == made.content
    assert again.headers["x-base-sha256"] == made.headers["x-base-sha256"]


def test_the_job_page_starts_an_export_with_its_own_form_only(deployment):
    service = deployment.services[0]
    with deployment.client("page-tenant") as api:
        key = api.headers["Authorization"].removeprefix("Bearer ")
        dataset = api.post("/v1/datasets", files={"file": ("rows.jsonl", ROWS)}).json()["id"]
        submitted = api.post("/v1/jobs", json=tiny_job(dataset, 4, group_size=32))
        assert submitted.status_code == 201, submitted.text
        job = submitted.json()
    cookie = sign_in(service, key)
    try:
        with browser(service, cookie) as page:
            job_page = page.get(f"/jobs/{job['id']}")
            assert job_page.status_code == 200
            link = f"/jobs/{job['id']}/base?format=gguf"
            assert f'href="{link}"' in job_page.text
            token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', job_page.text)[1]
            before = in_the_making(deployment.bases)
            offer = page.get(link)
            assert offer.status_code == 200 and 'id="export-base"' in offer.text
            with browser(service, cookie, origin="http://127.0.0.1:1") as foreign:
                refused = foreign.post(f"/jobs/{job['id']}/base",
                                       data={"format": "gguf", "csrf_token": token})
            assert refused.status_code == 403
            assert in_the_making(deployment.bases) == before
            started = page.post(f"/jobs/{job['id']}/base", headers={"Origin": service.url},
                                data={"format": "gguf", "csrf_token": token})
            assert started.status_code == 303 and started.headers["location"] == link
            deadline = time.monotonic() + 180
            while (answer := page.get(link)).status_code == 200:
                assert 'id="base-exporting"' in answer.text
                assert time.monotonic() < deadline, "the export never finished"
                time.sleep(0.2)
            assert answer.status_code == 303
            download = page.get(answer.headers["location"])
        assert download.status_code == 200 and download.content[:4] == b"GGUF"
        assert download.headers["x-base-sha256"]
    finally:
        service.request("POST", f"/v1/jobs/{job['id']}/cancel")


def test_a_tenant_starts_at_most_its_quota_of_exports_in_any_api_process(deployment):
    last = len(deployment.services) - 1  # the shared deployment: the other process
    with deployment.client("quota-tenant", index=0) as first, \
            deployment.client("quota-tenant", index=last) as second:
        made = served(first, format="gguf", dtype="float32", group_size=64)
        refused = second.get(BASE, params=NEVER_MADE)
        assert refused.status_code == 429, refused.text
        assert "MEBP_MAX_BASE_EXPORTS_PER_TENANT_PER_HOUR" in refused.json()["detail"]
        assert 0 < int(refused.headers["retry-after"]) <= 3600
        again = second.get(BASE, params={"format": "gguf", "dtype": "float32",
                                          "group_size": 64})
        assert again.status_code == 200 and again.content == made.content  # made: served


def test_kept_exports_stay_within_the_bound_least_recently_served_evicted_first(embedded):
    deployment = embedded  # files only: the database plays no part
    clients = [deployment.client(f"cache-{i}") for i in range(3)]  # one export each
    try:
        x = served(clients[0], format="hf", dtype="float16", group_size=64)
        y = served(clients[1], format="hf", dtype="bfloat16", group_size=64)
        assert 2 * len(x.content) <= CACHE_BYTES < 3 * len(x.content)
        served(clients[0], format="hf", dtype="float16", group_size=64)  # x served last
        z = served(clients[2], format="gguf", dtype="float16", group_size=64)
    finally:
        for client in clients:
            client.close()
    kept = {p.name: p.stat().st_size for p in deployment.bases.iterdir()
            if p.suffix in (".zip", ".gguf")}
    names = [filename(response) for response in (x, y, z)]
    assert names[0] in kept and names[2] in kept and names[1] not in kept, kept
    assert sum(kept.values()) <= CACHE_BYTES
    assert not [p for p in deployment.bases.iterdir() if p.name.startswith(names[1])]


def filename(response: httpx.Response) -> str:
    return re.search(r'filename="([^"]+)"', response.headers["content-disposition"])[1]
