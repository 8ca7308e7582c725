"""Webhook signatures on the real service, to a real receiver on loopback: a job's events
arrive signed with the tenant's secret (checked by hand with hmac and by the OpenAI SDK's
verifier), which another tenant never sees; after a rotation the previous secret signs too;
the secret is the API key's alone, not a signed-in dashboard's."""

from __future__ import annotations

import base64

import httpx
import pytest
from service_harness import API_KEY, create_key, tiny_job
from webhook_harness import all_ended, deliveries, submit, upload
from webhook_receiver import Received, verify


def test_a_jobs_start_and_success_arrive_signed_with_the_tenants_secret(hooked, receiver):
    url = receiver.url()
    job = submit(hooked, {**tiny_job(upload(hooked), 2), "webhook_url": url})
    assert job["webhook_url"] == url
    assert hooked.finished(job["id"])["status"] == "succeeded"
    rows = deliveries(hooked, f"/v1/jobs/{job['id']}", all_ended(2), "two deliveries")
    assert [r["event"] for r in rows] == ["job.running", "job.succeeded"]
    assert all(r["status"] == "delivered" and r["attempts"] == 1 and r["url"] == url
               and r["last_status_code"] == 200 and r["delivered_at"] is not None
               and r["next_attempt_at"] is None for r in rows), rows

    secret = hooked.request("GET", "/v1/webhook_secret")[1]["secret"]
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    received = receiver.at(url)
    assert [r.headers["webhook-id"] for r in received] == [r["id"] for r in rows]
    for record in received:
        verify(secret, record)
        assert record.headers["content-type"] == "application/json"
        assert record.event["id"] == record.headers["webhook-id"]
    assert [(r.event["type"], r.event["data"]["id"], r.event["data"]["status"])
            for r in received] == [("job.running", job["id"], "running"),
                                   ("job.succeeded", job["id"], "succeeded")]
    assert received[0].event["data"]["attempt"] == 1
    tampered = Received(url, received[0].headers, received[0].body.replace(b"running", b"x"))
    with pytest.raises(AssertionError):
        verify(secret, tampered)

    # another tenant sees neither the job's deliveries nor this tenant's secret
    other = httpx.Client(base_url=hooked.url, headers={
        "Authorization": f"Bearer {create_key(hooked, 'webhooks-other')}"})
    assert other.get(f"/v1/jobs/{job['id']}/webhook_deliveries").status_code == 404
    assert other.get("/v1/webhook_secret").json()["secret"] != secret


def test_after_a_rotation_both_secrets_sign_for_the_grace_period(hooked, receiver):
    """A receiver still holding the old secret (or a retry of an event from before the
    rotation) once failed every verification at once."""
    old = hooked.request("GET", "/v1/webhook_secret")[1]["secret"]
    status, rotated = hooked.request("POST", "/v1/webhook_secret/rotate")
    assert status == 200 and rotated["secret"] != old, rotated
    assert rotated["previous_expires_at"] is not None
    url = receiver.url()
    job = submit(hooked, {**tiny_job(upload(hooked), 1), "webhook_url": url})
    assert hooked.finished(job["id"])["status"] == "succeeded"
    deliveries(hooked, f"/v1/jobs/{job['id']}", all_ended(2), "two deliveries")
    assert len(receiver.at(url)) == 2
    for record in receiver.at(url):
        assert len(record.headers["webhook-signature"].split()) == 2, record.headers
        verify(rotated["secret"], record)
        verify(old, record)
    assert hooked.request("GET", "/v1/webhook_secret")[1]["secret"] == rotated["secret"]


def test_the_secret_is_the_api_keys_not_a_signed_in_dashboards(api):
    """A dashboard's cookie reads the API (GETs), but not the signing secret."""
    with api.anonymous() as browser:
        signed_in = browser.post("/signin", data={"api_key": API_KEY},
                                 headers={"Origin": api.url})
        assert signed_in.status_code == 303, signed_in.text
        cookie = {"Cookie": f"mebp_session={signed_in.cookies['mebp_session']}"}
        assert browser.get("/v1/jobs", headers=cookie).status_code == 200
        assert browser.get("/v1/webhook_secret", headers=cookie).status_code == 401
        assert browser.post("/v1/webhook_secret/rotate", headers={
            **cookie, "Origin": api.url}).status_code == 401
    assert api.request("GET", "/v1/webhook_secret")[0] == 200
