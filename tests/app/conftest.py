"""``mebp serve`` started as a real subprocess on a free port, with a known API key and a
seeded host calibration (so no test waits for a measurement)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

API_KEY = "test-key-0123456789"
@dataclass
class Service:
    url: str
    process: subprocess.Popen
    output: Path
    api_key: str = API_KEY

    def request(self, method: str, path: str, body: dict | None = None,
                key: str | None = API_KEY) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if key is not None:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def service(tmp_path_factory, seed_calibration) -> Service:
    root = tmp_path_factory.mktemp("service")
    cache = seed_calibration(root / "cache")
    port = free_port()
    env = {**os.environ, "MEBP_API_KEY": API_KEY, "MEBP_CACHE_DIR": str(cache),
           "HF_HUB_OFFLINE": "1"}
    output = root / "serve.log"
    with open(output, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port),
             "--data-dir", str(root / "data")], stdout=log, stderr=subprocess.STDOUT, env=env)
    service = Service(f"http://127.0.0.1:{port}", process, output)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(service.url + "/healthz", timeout=2):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"mebp serve did not start:\n{output.read_text()}") \
                    from None
            time.sleep(0.2)
    yield service
    process.terminate()
    process.wait(timeout=30)
