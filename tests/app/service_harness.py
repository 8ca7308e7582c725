"""The service under test, in two tiers: ``mebp serve`` as a real subprocess on a free port
(workers, caps, Redis and the database for real), or the same app in this process behind
Starlette's TestClient (the fast tier for validation, auth and tenancy: no worker runs, so
jobs stay queued). Both with a known API key and a seeded host calibration (so no test
waits for a measurement), and a client that uploads, follows event streams and waits for
jobs."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import psycopg
from fastapi.testclient import TestClient
from waiting import HANG_GUARD_S, poll_until  # noqa: F401  (re-exported: the tests import them from here)

API_KEY = "test-key-0123456789"
MAX_UPLOAD_BYTES = 256 << 10
MAX_UPLOAD_ROWS = 1000
MAX_LINE_BYTES = 4096
POSTGRES_ADMIN = os.environ.get("MEBP_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_TEST_URL = os.environ.get("MEBP_TEST_REDIS", "redis://127.0.0.1:6379/0")
TERMINAL = {"succeeded", "failed", "cancelled"}
# a lost worker noticed within seconds, for the tests that kill one
FAST_RECOVERY = {"MEBP_HEARTBEAT_TIMEOUT_S": "3", "MEBP_RECONCILE_INTERVAL_S": "0.5"}


@dataclass
class Service:
    url: str
    process: subprocess.Popen | None  # None: the app runs in this process
    output: Path  # the service's log, beside its data dir
    api_key: str = API_KEY
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    client: httpx.Client | None = None

    def __post_init__(self) -> None:
        if self.client is None:
            self.client = httpx.Client(base_url=self.url, timeout=120,
                                       headers={"Authorization": f"Bearer {self.api_key}"})

    def request(self, method: str, path: str, body: dict | None = None,
                key: str | None = API_KEY) -> tuple[int, dict]:
        headers = {} if key == API_KEY else {"Authorization": "" if key is None
                                             else f"Bearer {key}"}
        response = self.client.request(method, path, json=body, headers=headers)
        return response.status_code, response.json()

    def anonymous(self) -> httpx.Client:
        """A client with no key that follows no redirect, as a browser before it signs in."""
        if self.process is None:
            return GuestClient(self.client)
        return httpx.Client(base_url=self.url, timeout=60, follow_redirects=False)

    def upload(self, name: str, content: bytes) -> tuple[int, dict]:
        response = self.client.post("/v1/datasets", files={"file": (name, content)})
        return response.status_code, response.json()

    def wait_for(self, job_id: str, predicate, timeout_s: float = HANG_GUARD_S,
                 client: httpx.Client | None = None) -> dict:
        """Poll the job (as ``client``'s tenant if given) until ``predicate`` holds."""
        return poll_until(lambda: (client or self.client).get(f"/v1/jobs/{job_id}").json(),
                          predicate, timeout_s,
                          lambda job: f"job never reached the state wanted: {job}\n"
                                      f"{self.output.read_text()[-3000:]}")

    def base(self, model: str, timeout_s: float = HANG_GUARD_S, **params) -> httpx.Response:
        """``GET /v1/models/{model}/base``, asked again while it answers 202 (exporting)."""
        def exported(response: httpx.Response) -> bool:
            if response.status_code != 202:
                return True
            assert int(response.headers["retry-after"]) > 0
            return False
        return poll_until(
            lambda: self.client.get(f"/v1/models/{model}/base", params=params), exported,
            timeout_s, lambda _: f"the base of {model} was not exported in {timeout_s} s\n"
                                 f"{self.output.read_text()[-3000:]}")

    def finished(self, job_id: str, timeout_s: float = HANG_GUARD_S,
                 client: httpx.Client | None = None) -> dict:
        return self.wait_for(job_id, lambda job: job["status"] in TERMINAL, timeout_s, client)

    def fleet_when(self, fleet_id: str, predicate, what: str, timeout_s: float = 400) -> dict:
        """Poll the fleet until ``predicate`` holds (``what`` names it in the failure)."""
        return poll_until(
            lambda: self.request("GET", f"/v1/fleets/{fleet_id}")[1], predicate, timeout_s,
            lambda fleet: f"fleet {fleet_id}: {what} not done in {timeout_s} s: "
                          f"{fleet['rounds']} {fleet.get('references')}\n"
                          f"{self.output.read_text()[-3000:]}", interval_s=0.5)

    def fleet_after_rounds(self, fleet_id: str, rounds: int, timeout_s: float = 400) -> dict:
        """The fleet once ``rounds`` of its rounds have ended."""
        return self.fleet_when(
            fleet_id, lambda f: sum(r["status"] != "running" for r in f["rounds"]) >= rounds,
            f"{rounds} rounds", timeout_s)

    def adapter_tensors(self, path: str) -> dict:
        """The tensors of the PEFT adapter archive served at ``path``."""
        from safetensors.torch import load

        response = self.client.get(path)
        assert response.status_code == 200, response.text
        archive = zipfile.ZipFile(io.BytesIO(response.content))
        return load(archive.read("adapter_model.safetensors"))

    def job_events(self, job_id: str) -> list[dict]:
        """The job's events so far."""
        return self.request("GET", f"/v1/jobs/{job_id}/events")[1]

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


class GuestClient(TestClient):
    """Another client of an entered TestClient's app, on the event loop its lifespan started
    the app's tasks on; entering it does not run the lifespan again."""

    def __init__(self, host: TestClient) -> None:
        super().__init__(host.app, base_url=str(host.base_url), follow_redirects=False)
        self.portal = host.portal

    def __enter__(self) -> GuestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port from bind(0) is in that
    range, where any outgoing connection (Redis, httpx) may take it before the server binds."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100):
        port = random.randrange(10_000, ephemeral_low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 10000-{ephemeral_low}")


def service_env(cache: Path, extra_env: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, "MEBP_API_KEY": API_KEY, "MEBP_CACHE_DIR": str(cache),
           "HF_HUB_OFFLINE": "1", "MEBP_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
           "MEBP_MAX_UPLOAD_ROWS": str(MAX_UPLOAD_ROWS), "MEBP_MAX_LINE_BYTES": str(MAX_LINE_BYTES),
           **extra_env}
    for name in ("DATABASE_URL", "REDIS_URL"):
        if name not in extra_env:
            env.pop(name, None)
    return env


def start_service(root: Path, cache: Path, extra_env: dict[str, str], *,
                  workers: int = 1, own_group: bool = False, ready: bool = True) -> Service:
    """``mebp serve`` on a free port, once more on another if another process took that
    port between its pick and the server's bind; ``own_group``: in a session (and process
    group) of its own, which a test may signal whole. Returned once its health says it is
    calibrated with ``workers`` listening, or with ``ready=False`` once it answers at all."""
    for _ in range(2):
        with suppress(PortTakenError):
            return start_service_on(free_port(), root, cache, extra_env, workers=workers,
                                    own_group=own_group, ready=ready)
    return start_service_on(free_port(), root, cache, extra_env, workers=workers,
                            own_group=own_group, ready=ready)


class PortTakenError(RuntimeError):
    pass


def start_service_on(port: int, root: Path, cache: Path, extra_env: dict[str, str], *,
                     workers: int, own_group: bool = False, ready: bool = True) -> Service:
    env = service_env(cache, extra_env)
    root.mkdir(parents=True, exist_ok=True)
    output = root / "serve.log"
    with open(output, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers",
             str(workers), "--data-dir", str(root / "data")], stdout=log,
            stderr=subprocess.STDOUT, env=env, start_new_session=own_group)
    return await_started(Service(f"http://127.0.0.1:{port}", process, output),
                         workers=workers, ready=ready)


def await_started(service: Service, *, workers: int, ready: bool = True) -> Service:
    """``service`` once its health says it is calibrated with ``workers`` listening, or with
    ``ready=False`` once it answers at all; its process killed and an error with its log if
    it exits first or hangs."""
    deadline = time.monotonic() + HANG_GUARD_S  # imports alone take a minute at load 10
    while True:
        try:
            health = httpx.get(service.url + "/v1/health", timeout=10).json()
            # started: calibrated, its workers listening (a test may fill its disk: the
            # health's status is that test's to judge)
            if not ready or (health["calibration"] in ("ready", "provisional") and
                             health["workers"] >= workers):
                return service
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        if service.process.poll() is not None or time.monotonic() > deadline:
            service.process.kill()
            service.process.wait()
            log_text = service.output.read_text()
            failure = PortTakenError if "address already in use" in log_text else RuntimeError
            raise failure(f"mebp serve did not start:\n{log_text}")
        time.sleep(0.2)


def start_worker(data_dir: Path, cache: Path, extra_env: dict[str, str]) -> subprocess.Popen:
    """A `mebp worker` with its own data dir, in a session of its own so a test can kill it
    and everything under it (``kill_group``)."""
    return subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--data-dir",
                             str(data_dir)], env=service_env(cache, extra_env),
                            start_new_session=True)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the worker and everything under it (RQ's work horse runs the job in a process
    group of its own), as when its machine dies."""
    family = [process.pid] + [child.pid for child in
                              psutil.Process(process.pid).children(recursive=True)]
    for pid in family:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


@contextmanager
def deployed_service(deployment: str, root: Path, cache: Path, env: dict[str, str], *,
                     workers: int) -> Iterator[tuple[Service, str]]:
    """`mebp serve` on ``deployment`` ("embedded": SQLite and its own Redis; "shared": a
    fresh PostgreSQL database and the machine's Redis, on a queue of its own), and its
    database URL; stopped, and the database dropped, after."""
    from service.db import database_url

    with ExitStack() as stack:
        url = database_url(None, root / "data")
        if deployment == "shared":
            url = stack.enter_context(temporary_postgres_database())
            env = {**env, "DATABASE_URL": url, "REDIS_URL": REDIS_TEST_URL,
                   "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}"}
        service = start_service(root, cache, env, workers=workers)
        # a service that ignores SIGTERM (a test of what once hung it) is killed, never left
        stack.callback(service.process.kill)
        stack.callback(stop_service, service)
        yield service, url


def stop_service(service: Service) -> None:
    service.client.close()
    service.process.terminate()
    service.process.wait(timeout=60)


@contextmanager
def in_process_service(root: Path, cache: Path, model_root: Path,
                       database: str | None = None, **settings_overrides) -> Iterator[Service]:
    """The app of ``mebp serve`` in this process over ``database`` (SQLite in ``root`` if
    None) and the machine's Redis (a queue of its own, emptied after), with the subprocess
    tier's limits and any other ``Settings`` given."""
    from app.main import create_app
    from service.base_export_queue import exports_queue_name
    from service.db import database_url, upgrade_database
    from service.queue import connect, job_queue
    from service.settings import Settings

    data = root / "data"
    settings = Settings(data_dir=data, cache_dir=cache, api_key=API_KEY,
                        DATABASE_URL=database, REDIS_URL=REDIS_TEST_URL,
                        queue_name=f"mebp-test-{uuid.uuid4().hex[:8]}",
                        model_roots=str(model_root), **{
                            "max_upload_bytes": MAX_UPLOAD_BYTES,
                            "max_upload_rows": MAX_UPLOAD_ROWS,
                            "max_line_bytes": MAX_LINE_BYTES, **settings_overrides})
    data.mkdir(parents=True)
    upgrade_database(database_url(database, data))
    output = root / "serve.log"
    output.touch()
    with TestClient(create_app(settings, reconcile=False), base_url="http://testserver",
                    headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        yield Service("http://testserver", None, output, client=client)
    job_queue(connect(REDIS_TEST_URL), settings.queue_name).empty()
    job_queue(connect(REDIS_TEST_URL), exports_queue_name(settings.queue_name)).empty()


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


def tiny_job(dataset: str, steps: int, **hyperparameters) -> dict:
    """A job body: the tiny preset on a pixel-8 for ``steps`` steps of 32 tokens, unless
    ``hyperparameters`` say otherwise."""
    return {"model": "preset:tiny", "training_file": dataset, "device": "pixel-8",
            "hyperparameters": {"steps": steps, "seq_len": 32, **hyperparameters}}


def create_key(service, tenant: str, *extra: str) -> str:
    """`mebp keys create`, as an operator runs it against the service's database."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "keys", "create", "--tenant",
                           tenant, *extra, "--data-dir", str(service.output.parent / "data")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
