"""docker-compose.yml runs the commands the README documents, with settings the service
reads (no Docker engine runs here, so the file is checked, not started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_compose_has_api_workers_redis_and_postgres_wired_together():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"api", "worker", "redis", "postgres"} <= set(services)
    api, worker = services["api"], services["worker"]
    assert api["command"][:2] == ["mebp", "serve"] and worker["command"] == ["mebp", "worker"]
    for service in (api, worker):
        env = service["environment"]
        assert env["DATABASE_URL"].startswith("postgresql://")
        assert env["REDIS_URL"].startswith("redis://redis:")
        assert env["MEBP_STORAGE_DIR"] == "/data/storage" and "data:/data" in service["volumes"]
        settings = Settings(**{"DATABASE_URL": env["DATABASE_URL"],
                               "REDIS_URL": env["REDIS_URL"]})
        assert settings.redis_url == env["REDIS_URL"]
    # the worker can make cgroups: the host's tree, writable
    assert worker["privileged"] and worker["cgroup"] == "host"
    assert "/sys/fs/cgroup:/sys/fs/cgroup:rw" in worker["volumes"]


def test_the_compose_commands_exist():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name in ("api", "worker"):
        command = compose["services"][name]["command"]
        done = subprocess.run([sys.executable, "-m", "app.cli", *command[1:2], "--help"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        for flag in command[2::2]:
            assert flag in done.stdout, (name, flag)
