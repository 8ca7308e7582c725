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
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from mebp_core.plan.calibration import HostCalibration, calibration_path

API_KEY = "test-key-0123456789"
HOST = HostCalibration(
    threads=2, runtime_anon_bytes=150 << 20,
    matmul_flops={dtype: {form: {"256": {"64": 3e10, "1024": 8e10},
                                 "4096": {"64": 5e10, "1024": 1.2e11}}
                          for form in ("nt", "nn")} for dtype in ("float32", "bfloat16")},
    decompress_params_per_s={q: {"float32": 3e9, "bfloat16": 3e9}
                             for q in ("int4", "int8", "none")},
    elementwise_bytes_per_s=1e10, op_overhead_s=7e-6, decompress_call_s=1e-5,
    disk_read_bytes_per_s=1e9)


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
def service(tmp_path_factory) -> Service:
    root = tmp_path_factory.mktemp("service")
    cache = root / "cache"
    path = calibration_path(cache, None)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(asdict(HOST)))
    port = free_port()
    env = {**os.environ, "MEBP_API_KEY": API_KEY, "MEBP_CACHE_DIR": str(cache),
           "HF_HUB_OFFLINE": "1"}
    output = root / "serve.log"
    with open(output, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mebp_core.cli", "serve", "--port", str(port),
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
