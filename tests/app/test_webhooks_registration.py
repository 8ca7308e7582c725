"""A webhook_url on a job or a fleet, on the real service: a job made by the OpenAI SDK posts
to the URL in its extra body; a cancelled job, running or queued, posts cancelled; a federated
fleet posts each round and its end while its devices' jobs post nothing; a URL that is not
http(s), cannot be encoded, is the service's own or a private address given literally is a
422 naming webhook_url; a public address is taken."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI
from service_harness import create_key, tiny_job
from webhook_harness import all_ended, deliveries, submit, upload
from webhook_receiver import verify


def test_a_job_made_by_the_openai_sdk_posts_to_the_url_in_its_extra_body(hooked, receiver):
    url = receiver.url()
    client = OpenAI(base_url=f"{hooked.url}/v1", api_key=hooked.api_key)
    job = client.fine_tuning.jobs.create(
        model="preset:tiny", training_file=upload(hooked), extra_body={
            "device": "pixel-8", "hyperparameters": {"steps": 1, "seq_len": 32},
            "webhook_url": url})
    assert hooked.finished(job.id)["status"] == "succeeded"
    rows = deliveries(hooked, f"/v1/jobs/{job.id}", all_ended(2), "two deliveries")
    assert [(r["event"], r["status"]) for r in rows] == [("job.running", "delivered"),
                                                        ("job.succeeded", "delivered")]
    assert [r.event["data"]["id"] for r in receiver.at(url)] == [job.id, job.id]


def test_a_cancelled_job_posts_cancelled(hooked, receiver, cancel_at_end):
    url = receiver.url()
    dataset = upload(hooked)
    # no checkpoint on the way: a tiny step is quick, so 25 (the default) may pass before the
    # cancel, and a checkpoint posts an event of its own
    body = {**tiny_job(dataset, 100_000, checkpoint_every=100_000), "webhook_url": url}
    running = submit(hooked, body)
    cancel_at_end(hooked, running["id"])
    queued = submit(hooked, body)  # behind it
    cancel_at_end(hooked, queued["id"])
    hooked.wait_for(running["id"], lambda job: job["progress"]["step"] >= 1)
    for job in (queued, running):
        assert hooked.request("POST", f"/v1/jobs/{job['id']}/cancel")[0] == 200
        assert hooked.finished(job["id"])["status"] == "cancelled"
    rows = deliveries(hooked, f"/v1/jobs/{running['id']}", all_ended(2), "two deliveries")
    assert [(r["event"], r["status"]) for r in rows] == [("job.running", "delivered"),
                                                        ("job.cancelled", "delivered")]
    rows = deliveries(hooked, f"/v1/jobs/{queued['id']}", all_ended(1), "one delivery")
    assert [(r["event"], r["status"]) for r in rows] == [("job.cancelled", "delivered")]
    events = [(r.event["data"]["id"], r.event["type"]) for r in receiver.at(url)]
    assert (queued["id"], "job.cancelled") in events and (running["id"], "job.cancelled") \
        in events


def test_a_federated_fleet_posts_each_round_and_its_end(hooked, receiver):
    url = receiver.url()
    status, fleet = hooked.request("POST", "/v1/fleets", {
        "model": "preset:tiny", "training_file": upload(hooked), "webhook_url": url,
        "simulated": {"device": "iphone-15-pro-max", "count": 2},
        "hyperparameters": {"steps": 1, "seq_len": 32}, "aggregation": "fedavg",
        "rounds": 2, "seed": 1})
    assert status == 201, fleet
    assert fleet["webhook_url"] == url
    path = f"/v1/fleets/{fleet['id']}"
    rows = deliveries(hooked, path, all_ended(3), "three deliveries")
    assert [(r["event"], r["status"]) for r in rows] == [
        ("fleet.round.done", "delivered"), ("fleet.round.done", "delivered"),
        ("fleet.done", "delivered")]
    assert hooked.request("GET", path)[1]["status"] == "done"
    secret = hooked.request("GET", "/v1/webhook_secret")[1]["secret"]
    received = receiver.at(url)
    for record in received:
        verify(secret, record)
    # deliveries are unordered (each attempt on its own): compared as a set
    assert sorted((r.event["type"], r.event["data"].get("round", -1)) for r in received) == [
        ("fleet.done", -1), ("fleet.round.done", 0), ("fleet.round.done", 1)]
    assert all(r.event["data"]["id"] == fleet["id"] for r in received)
    assert all(r.event["data"]["outcomes"] == ["trained", "trained"] for r in received
               if r.event["type"] == "fleet.round.done")
    # its devices' jobs post nothing of their own
    member_job = hooked.request("GET", path)[1]["rounds"][0]["participants"][0]["job_id"]
    assert hooked.request("GET", f"/v1/jobs/{member_job}/webhook_deliveries")[1]["data"] == []
    other = httpx.Client(base_url=hooked.url, headers={
        "Authorization": f"Bearer {create_key(hooked, 'webhooks-fleet-other')}"})
    assert other.get(f"{path}/webhook_deliveries").status_code == 404


@pytest.mark.parametrize("where", ["own", "localhost", "ftp", "emoji"])
def test_a_webhook_url_not_http_or_at_the_service_itself_is_a_422(hooked, where):
    port = hooked.url.rsplit(":", 1)[1]
    url = {"own": f"{hooked.url}/v1/health", "localhost": f"http://localhost:{port}/x",
           "ftp": "ftp://127.0.0.1/hook", "emoji": "http://\N{SLIGHTLY SMILING FACE}.com/"}[where]
    why = {"ftp": "URL scheme should be 'http' or 'https'",
           "emoji": "must be a URL that can be sent to"}.get(
        where, "must not point at this service itself")
    dataset = upload(hooked)
    status, refused = hooked.request("POST", "/v1/jobs",
                                     {**tiny_job(dataset, 1), "webhook_url": url})
    assert status == 422 and refused["detail"][0]["loc"] == ["body", "webhook_url"], refused
    assert why in refused["detail"][0]["msg"]
    status, refused = hooked.request("POST", "/v1/fine_tuning/jobs", {
        **tiny_job(dataset, 1), "webhook_url": url})
    assert status == 422 and refused["error"]["param"] == "webhook_url", refused
    assert why in refused["error"]["message"]
    status, refused = hooked.request("POST", "/v1/fleets", {
        "model": "preset:tiny", "training_file": dataset, "webhook_url": url,
        "simulated": {"device": "pixel-8", "count": 2}})
    assert status == 422 and refused["detail"][0]["loc"] == ["body", "webhook_url"], refused
    assert why in refused["detail"][0]["msg"]


@pytest.mark.parametrize("url", [
    "http://10.1.2.3/hook", "http://192.168.0.1/hook", "http://169.254.169.254/latest",
    "http://[::1]:9/hook", "http://[fd00::1]/hook", "http://0.0.0.0:9/hook",
    "http://2130706433:9/hook", "http://[::ffff:127.0.0.1]:9/hook", "http://localhost:9/x"])
def test_a_private_address_given_literally_is_a_422(api, url):
    """Without MEBP_WEBHOOK_ALLOW_PRIVATE (the fast tier's default)."""
    status, refused = api.request("POST", "/v1/jobs", {**tiny_job(upload(api), 1),
                                                       "webhook_url": url})
    assert status == 422 and refused["detail"][0]["loc"] == ["body", "webhook_url"], refused
    assert "must not be a private" in refused["detail"][0]["msg"]


def test_a_public_address_is_taken(api):
    status, job = api.request("POST", "/v1/jobs", {**tiny_job(upload(api), 1),
                                                   "webhook_url": "https://example.com/hook"})
    assert status == 201 and job["webhook_url"] == "https://example.com/hook", job
