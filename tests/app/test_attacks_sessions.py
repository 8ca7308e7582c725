"""Attacks on the dashboard's sessions and forms, in process (no worker, so the jobs stay
queued and a refused cancel is visible), and over a real `mebp serve` where a proxy's header
is what is tested: a form posted from another origin (another port of the same host
included, which SameSite does not separate) with a valid cookie is refused and changes
nothing; every sign-in is a new session that sign-out, expiry and revoking its key end; a
deeply nested `config` on the job form is answered with a message, never a 500."""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
from service_harness import API_KEY, create_key, in_process_service

ROWS = b'{"text": "forms are posted from their own pages"}\n' * 8
COOKIE = "mebp_session"


@pytest.fixture(scope="module")
def dataset_id(api) -> str:
    status, body = api.upload("forms.jsonl", ROWS)
    assert status == 201, body
    return body["id"]


def browser(service) -> httpx.Client:
    """A client with no key that keeps its cookie by hand, as a browser would."""
    return service.anonymous()


def sign_in(service, key: str = API_KEY) -> str:
    with browser(service) as client:
        response = client.post("/signin", data={"api_key": key},
                               headers={"Origin": service.url})
    assert response.status_code == 303, response.text
    return response.cookies[COOKIE]


def page_token(service, cookie: str) -> str:
    with browser(service) as client:
        page = client.get("/jobs", headers={"Cookie": f"{COOKIE}={cookie}"})
    assert page.status_code == 200, page.status_code
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text).group(1)


def post_form(service, path: str, cookie: str | None, data: dict,
              origin: str | None) -> httpx.Response:
    headers = {"Cookie": f"{COOKIE}={cookie}"} if cookie else {}
    if origin is not None:
        headers["Origin"] = origin
    with browser(service) as client:
        return client.post(path, data=data, headers=headers)


def signed_in(service, cookie: str) -> bool:
    """The API read with the cookie works, and a page shows instead of sending to /signin."""
    with browser(service) as client:
        api = client.get("/v1/jobs", headers={"Cookie": f"{COOKIE}={cookie}"}).status_code
        page = client.get("/jobs", headers={"Cookie": f"{COOKIE}={cookie}"})
    assert api in (200, 401) and page.status_code in (200, 303)
    assert (api == 200) == (page.status_code == 200)
    if page.status_code == 303:
        assert page.headers["location"] == "/signin"
    return api == 200


def queued_job(api, dataset_id: str) -> str:
    status, job = api.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": dataset_id, "device": "pixel-8",
        "hyperparameters": {"steps": 1, "seq_len": 16}})
    assert status == 201, job
    return job["id"]


def job_form(dataset_id: str, token: str, **extra: str) -> dict:
    return {"model": "preset:tiny", "device": "pixel-8", "training_file": dataset_id,
            "steps": "1", "seq_len": "16", "csrf_token": token, **extra}


def job_count(api) -> int:
    return api.client.get("/v1/jobs").json()["count"]


def test_every_form_refuses_a_foreign_origin_and_changes_nothing(api, dataset_id):
    cookie = sign_in(api)
    token = page_token(api, cookie)
    job_id = queued_job(api, dataset_id)
    other_port = api.url + ":8001"  # the same host on another port
    jobs_before = job_count(api)
    for origin in (other_port, "http://evil.example", "null", None):
        forms = [(f"/jobs/{job_id}/cancel", {"csrf_token": token}),
                 ("/jobs/new", job_form(dataset_id, token)),
                 ("/signout", {"csrf_token": token})]
        for path, data in forms:
            response = post_form(api, path, cookie, data, origin)
            assert response.status_code == 403, (path, origin, response.status_code)
            assert "this service's pages" in response.json()["detail"]
        refused = post_form(api, "/signin", None, {"api_key": API_KEY}, origin)
        assert refused.status_code == 403 and COOKIE not in refused.cookies, origin
    assert api.client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
    assert job_count(api) == jobs_before
    assert signed_in(api, cookie)


def test_a_form_without_the_sessions_token_is_refused(api, dataset_id):
    cookie = sign_in(api)
    job_id = queued_job(api, dataset_id)
    stale = page_token(api, sign_in(api))  # another session's token
    for data in ({}, {"csrf_token": "0" * 64}, {"csrf_token": stale}):
        response = post_form(api, f"/jobs/{job_id}/cancel", cookie, data, api.url)
        assert response.status_code == 403 and "token" in response.json()["detail"]
    assert api.client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"


def test_the_forms_work_from_the_services_own_origin(api, dataset_id):
    cookie = sign_in(api)
    token = page_token(api, cookie)
    created = post_form(api, "/jobs/new", cookie, job_form(dataset_id, token), api.url)
    assert created.status_code == 303, created.text
    job_id = created.headers["location"].removeprefix("/jobs/")
    assert api.client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
    # without Origin, the Referer of the service's own page is enough
    with browser(api) as client:
        cancelled = client.post(f"/jobs/{job_id}/cancel", data={"csrf_token": token},
                                headers={"Cookie": f"{COOKIE}={cookie}",
                                         "Referer": f"{api.url}/jobs/{job_id}"})
    assert cancelled.status_code == 303, cancelled.text
    assert api.client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    assert post_form(api, "/signout", cookie, {"csrf_token": token}, api.url).status_code == 303


def test_each_sign_in_is_a_session_that_sign_out_ends(any_api):
    service = any_api
    with browser(service) as client:
        response = client.post("/signin", data={"api_key": API_KEY},
                               headers={"Origin": service.url})
    first, second = response.cookies[COOKIE], sign_in(service)
    assert first != second
    attributes = response.headers["set-cookie"].lower()
    assert "httponly" in attributes and "samesite=strict" in attributes
    assert "max-age=43200" in attributes and "secure" not in attributes  # plain http here
    assert signed_in(service, first) and signed_in(service, second)
    signed_out = post_form(service, "/signout", first, {"csrf_token": page_token(service, first)},
                           service.url)
    assert signed_out.status_code == 303 and signed_out.headers["location"] == "/signin"
    assert not signed_in(service, first)
    assert signed_in(service, second)  # another browser's session goes on
    # a forged cookie (the old scheme's key hash, signed or not) signs nobody in
    assert not signed_in(service, hashlib.sha256(API_KEY.encode()).hexdigest())


def test_the_cookie_is_secure_when_served_over_https(service):
    # uvicorn trusts X-Forwarded-Proto from a proxy on 127.0.0.1, as a TLS front end sends it
    https_origin = "https://" + service.url.removeprefix("http://")
    with browser(service) as client:
        response = client.post("/signin", data={"api_key": API_KEY},
                               headers={"Origin": https_origin, "X-Forwarded-Proto": "https"})
    assert response.status_code == 303, response.text
    assert "secure" in response.headers["set-cookie"].lower()


def test_a_session_expires_after_its_ttl(tmp_path, model_cache, model_root):
    with in_process_service(tmp_path, model_cache, model_root, session_ttl_s=4) as service:
        signed_in_at = time.monotonic()
        with browser(service) as client:
            response = client.post("/signin", data={"api_key": API_KEY},
                                   headers={"Origin": service.url})
        cookie = response.cookies[COOKIE]
        assert "max-age=4" in response.headers["set-cookie"].lower()
        if time.monotonic() - signed_in_at < 3:  # on a slow machine it may be gone already
            assert signed_in(service, cookie)
        time.sleep(max(0.0, signed_in_at + 5 - time.monotonic()))
        assert not signed_in(service, cookie)


def test_revoking_a_key_ends_its_sessions(api):
    key = create_key(api, "revoked-tenant")
    cookie = sign_in(api, key)
    assert signed_in(api, cookie)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "keys", "revoke", "--key", key,
                           "--data-dir", str(api.output.parent / "data")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert not signed_in(api, cookie)
    database = sqlite3.connect(api.output.parent / "data" / "mebp.db")
    left = database.execute("select count(*) from dashboard_sessions where key_hash = ?",
                            (hashlib.sha256(key.encode()).hexdigest(),)).fetchone()[0]
    database.close()
    assert left == 0


@pytest.mark.parametrize(("config", "message"), [
    ("[" * 5000 + "]" * 5000, "recursion limit exceeded"),
    ('{"a": ' * 2000 + "1" + "}" * 2000, "recursion limit exceeded"),
    ('["' + "x" * 40_000 + '"]', "longer than"),
    ('{"not json"', "not JSON"),
], ids=["deep-array", "deep-object", "huge", "not-json"])
def test_a_deep_or_huge_config_on_the_job_form_is_answered_with_a_message(api, dataset_id,
                                                                          config, message):
    cookie = sign_in(api)
    jobs_before = job_count(api)
    response = post_form(api, "/jobs/new", cookie,
                         job_form(dataset_id, page_token(api, cookie), config=config), api.url)
    assert response.status_code == 422, response.status_code
    assert 'role="alert"' in response.text or 'class="error"' in response.text
    assert message in response.text and "config" in response.text
    assert job_count(api) == jobs_before


def test_the_job_form_has_an_input_for_every_hyperparameter_and_submits_them(api,
                                                                            dataset_id):
    """The form is derived from the API's Hyperparameters (themselves TrainConfig's fields):
    a field added there appears here with no other edit, and what is typed reaches the job."""
    from app.training_schemas import Hyperparameters

    cookie = sign_in(api)
    with browser(api) as client:
        page = client.get("/jobs/new?model=preset:tiny&seq_len=16",
                          headers={"Cookie": f"{COOKIE}={cookie}"})
    assert page.status_code == 200
    for name, field in Hyperparameters.model_fields.items():
        assert f'name="{field.alias or name}"' in page.text, name  # by its public name
    response = post_form(api, "/jobs/new", cookie,
                         job_form(dataset_id, page_token(api, cookie), warmup_steps="1",
                                  lora_alpha="4", schedule="cosine", max_grad_norm=""),
                         api.url)
    assert response.status_code == 303, response.text
    job_id = response.headers["location"].rsplit("/", 1)[1]
    config = api.client.get(f"/v1/jobs/{job_id}").json()["config"]
    assert (config["warmup_steps"], config["lora_alpha"], config["schedule"]) == \
        (1, 4.0, "cosine")
    assert config["max_grad_norm"] is None  # left blank: the default
