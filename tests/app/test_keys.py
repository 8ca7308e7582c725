"""Keys an operator can live with (issue 31, item 3): `mebp serve` without `MEBP_API_KEY`
used to mint, print and store a new admin key on every start, never revoking the previous
ones; now it keeps the key it made (owner-only, in the data dir) and makes another only once
that one is revoked. Keys may expire, and `mebp keys list` shows every key by its prefix."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
from service_harness import create_key, free_port, service_env


def keys(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = service_env(Path("/nonexistent"), {})
    for name in ("MEBP_API_KEY", "DATABASE_URL"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "app.cli", "keys", *args, "--data-dir",
                           str(data_dir)], capture_output=True, text=True, timeout=120, env=env)


def serve_once(data_dir: Path, cache: Path) -> str:
    """Start `mebp serve` without MEBP_API_KEY, check its key answers, stop it; its key."""
    env = service_env(cache, {})
    del env["MEBP_API_KEY"]
    port = free_port()
    log = data_dir.parent / f"serve-{port}.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port",
                                    str(port), "--workers", "0", "--data-dir", str(data_dir)],
                                   stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 90
        while (match := re.search(r"API key: (\S+)", log.read_text())) is None:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        key = match[1]
        url = f"http://127.0.0.1:{port}/v1/jobs"
        while True:
            try:
                answer = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        assert answer.status_code == 200, answer.text
        return key
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_a_restart_keeps_its_key_and_a_revoked_one_is_replaced(tmp_path, model_cache):
    data_dir = tmp_path / "data"
    first = serve_once(data_dir, model_cache)
    kept = data_dir / "api-key"
    assert kept.read_text().strip() == first
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600  # the owner's alone
    assert serve_once(data_dir, model_cache) == first  # no second admin key
    listed = keys(data_dir, "list")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[1:]
    assert len(rows) == 1 and rows[0].startswith(first[:12] + "...") and " yes " in rows[0]

    revoked = keys(data_dir, "revoke", "--key", first)
    assert revoked.returncode == 0 and not kept.exists(), revoked.stderr
    second = serve_once(data_dir, model_cache)
    assert second != first and kept.read_text().strip() == second


def test_a_key_with_an_expiry_stops_working_and_the_list_shows_its_use(api):
    from sqlmodel import Session, update

    from app.keys import hash_key
    from service.models import ApiKey, utc_now

    key = create_key(api, "expiring", "--expires-in", "1d")
    as_key = {"Authorization": f"Bearer {key}"}
    assert api.client.get("/v1/jobs", headers=as_key).status_code == 200
    data_dir = api.output.parent / "data"
    listed = keys(data_dir, "list", "--tenant", "expiring")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:4] == ["prefix", "tenant", "admin", "created"]
    assert row.startswith(key[:12] + "...") and "never" not in row  # expires, and was used
    with Session(api.client.app.state.engine) as session:  # a day has passed
        session.exec(update(ApiKey).where(ApiKey.key_hash == hash_key(key))
                     .values(expires_at=utc_now()))
        session.commit()
    assert api.client.get("/v1/jobs", headers=as_key).status_code == 401


def test_an_expiry_that_is_not_a_duration_is_refused(tmp_path):
    done = keys(tmp_path / "data", "create", "--tenant", "t", "--expires-in", "soon")
    assert done.returncode == 2 and "a duration is a positive number" in done.stderr


def test_a_read_answers_when_the_keys_last_use_cannot_be_written(shared_api):
    """Noting a key's last use is a write; a database that takes no writes (here read-only,
    as one with a full disk) must not turn a read into an error."""
    from sqlmodel import Session

    from app.keys import create_key as make_key

    engine = shared_api.client.app.state.engine
    with Session(engine) as session:
        key = make_key(session, tenant="read-only")
    database = engine.url.database
    admin_url = engine.url.set(database="postgres").render_as_string(hide_password=False)
    admin_url = admin_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'alter database "{database}" set default_transaction_read_only = on')
        try:
            engine.dispose()  # new connections take the setting
            answer = shared_api.client.get("/v1/jobs",
                                           headers={"Authorization": f"Bearer {key}"})
            assert answer.status_code == 200, answer.text
        finally:
            admin.execute(f'alter database "{database}" reset default_transaction_read_only')
            engine.dispose()
