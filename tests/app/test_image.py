"""The image docker-compose.yml scales out with runs the service, proved without a Docker
engine: what the Dockerfile copies, installed the way it installs it
(tests/app/image_harness.py), runs the compose file's `mebp serve --workers 0` and
`mebp worker` from there against PostgreSQL and Redis through one job.

Cached: the image's virtualenv (torch and every library the service imports), under
~/.cache/mebp/image-<digest of pyproject.toml, Dockerfile and .dockerignore>/, so only the
first run on a machine pays the install (minutes); the sources are copied afresh every run.
The one substitution is torch's index (see image_harness)."""

from __future__ import annotations

import socket
import subprocess
import uuid
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from image_harness import ROOT, Image, built_image, missing_debian_packages, read_dockerfile
from service_harness import (
    API_KEY,
    REDIS_TEST_URL,
    Service,
    await_started,
    free_port,
    stop_service,
    temporary_postgres_database,
    tiny_job,
)

ROWS = b'{"text": "the image trains"}\n' * 8
# modules only `mebp serve` and the worker import: their bytecode in the copy says they ran it
RAN_FROM_THE_COPY = ("app/serve.py", "worker/runner.py", "service/queue.py",
                     "mebp_core/engine/train.py")


@pytest.fixture(scope="module")
def image():
    with built_image() as image:
        yield image


def compose_command(service: str, **values: str) -> list[str]:
    """docker-compose.yml's command for ``service``, with ``values`` for its flags
    (``host="127.0.0.1"`` sets ``--host``'s)."""
    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())[
        "services"][service]["command"]
    for flag, value in values.items():
        command[command.index(f"--{flag}") + 1] = value
    return command


def container_env(image: Image, home: Path, settings: dict[str, str]) -> dict[str, str]:
    """A container's environment: the image's PATH and ENV and the deployment's settings;
    nothing of this test's (no PYTHONPATH reaching the checkout)."""
    return {"PATH": f"{image.bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
            **image.dockerfile.env, **settings}


def run_in_image(image: Image, command: list[str], env: dict[str, str], log: Path,
                 stack: ExitStack) -> subprocess.Popen:
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=image.workdir, env=env, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    stack.callback(process.wait, timeout=60)
    stack.callback(process.terminate)
    return process


def test_the_harness_reads_apt_and_pip_installs_and_refuses_any_other_command(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM python:3.11-slim\n"
                          "RUN apt-get update && apt-get install -y --no-install-recommends \\\n"
                          "    -o Dpkg::Use-Pty=0 libjemalloc2 tini \\\n"
                          "    && rm -rf /var/lib/apt/lists/*\n"
                          "RUN pip install --no-cache-dir -e .\n")
    image = read_dockerfile(dockerfile)
    assert image.debian_packages == ["libjemalloc2", "tini"]
    assert image.installs == [["--no-cache-dir", "-e", "."]]
    assert missing_debian_packages(["dpkg", "no-such-package-mebp"]) == ["no-such-package-mebp"]

    dockerfile.write_text("FROM python:3.11-slim\nRUN pip install torch && curl -O x\n")
    with pytest.raises(ValueError, match="'curl -O x' is not a `pip install`"):
        read_dockerfile(dockerfile)
    dockerfile.write_text("FROM python:3.11-slim\nRUN apt-get install -y tini || true\n")
    with pytest.raises(ValueError, match="'||' is not reproduced"):
        read_dockerfile(dockerfile)
    dockerfile.write_text("FROM python:3.11-slim\nRUN apt-get install -y tini=0.19.0-1\n")
    with pytest.raises(ValueError, match="version pins"):
        read_dockerfile(dockerfile)


@pytest.mark.slow  # its first run on a machine installs the image's libraries
def test_the_image_serves_and_works_a_job_on_postgres_and_redis(image, tmp_path, model_cache):
    with ExitStack() as stack:
        settings = {
            "DATABASE_URL": stack.enter_context(temporary_postgres_database()),
            "REDIS_URL": REDIS_TEST_URL, "MEBP_QUEUE_NAME": f"mebp-test-{uuid.uuid4().hex[:8]}",
            "MEBP_API_KEY": API_KEY, "MEBP_STORAGE_DIR": str(tmp_path / "storage"),
            "MEBP_CACHE_DIR": str(model_cache)}  # seeded calibration: nothing measures
        port = free_port()
        api = run_in_image(image, compose_command("api", host="127.0.0.1", port=str(port)),
                           container_env(image, tmp_path, {
                               **settings, "MEBP_DATA_DIR": str(tmp_path / "api")}),
                           tmp_path / "api.log", stack)
        service = await_started(Service(f"http://127.0.0.1:{port}", api, tmp_path / "api.log"),
                                workers=0)
        stack.callback(service.client.close)
        worker = run_in_image(image, compose_command("worker"), container_env(
            image, tmp_path, {**settings, "MEBP_DATA_DIR": str(tmp_path / "worker")}),
            tmp_path / "worker.log", stack)

        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, 4))[1]
        done = service.finished(job["id"])
        assert done["status"] == "succeeded", (done, (tmp_path / "worker.log").read_text())
        assert done["worker"] == f"{socket.gethostname()}:{worker.pid}"
        assert service.client.get(f"/v1/jobs/{job['id']}/adapter").status_code == 200

        # the copy's sources are what ran: it was made without bytecode, which importing
        # its modules wrote beside them
        for source in RAN_FROM_THE_COPY:
            path = image.workdir / source
            assert list(path.parent.glob(f"__pycache__/{path.stem}.*.pyc")), source
        where = subprocess.run(
            ["python", "-c", "import app.cli, mebp_core.config, service.settings, worker.main; "
             "print(*(m.__file__ for m in (app.cli, mebp_core.config, service.settings, "
             "worker.main)))"],
            cwd=image.workdir, env=container_env(image, tmp_path, settings),
            capture_output=True, text=True, check=True)
        for module_file in where.stdout.split():
            assert Path(module_file).is_relative_to(image.workdir), where.stdout
        stop_service(service)
