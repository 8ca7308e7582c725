"""A job's estimated time on its phone beside this host's figures, in ``GET /v1/jobs/{id}``
(the fast tier: jobs stay queued, their plan is made when they are submitted)."""

from __future__ import annotations


def test_a_job_shows_its_phones_estimated_time_per_step_and_in_all(api):
    dataset = api.upload("train.jsonl", b'{"text": "phones learn on the go"}\n' * 4)[1]["id"]
    job = {"model": "preset:tiny", "training_file": dataset, "device": "pixel-8",
           "hyperparameters": {"seq_len": 32, "steps": 20}}
    status, on_phone = api.request("POST", "/v1/jobs", job)
    assert status == 201, on_phone
    status, read = api.request("GET", f"/v1/jobs/{on_phone['id']}")
    assert status == 200, read
    progress, per_step = read["progress"], read["plan"]["device_step_time_s_estimate"]
    assert per_step > 0 and progress["device_step_time_s_estimate"] == per_step
    assert progress["device_time_s_estimate"] == round(20 * per_step, 1)
    assert progress["predicted_step_time_s"] > 0  # this host's, beside it
    # a custom budget has no phone: no estimate
    status, custom = api.request("POST", "/v1/jobs", {**job, "device": None,
                                                     "memory_budget_mb": 1024})
    assert status == 201, custom
    progress = api.request("GET", f"/v1/jobs/{custom['id']}")[1]["progress"]
    assert progress["device_step_time_s_estimate"] is None
    assert progress["device_time_s_estimate"] is None


def test_the_openapi_document_explains_the_estimates(api):
    progress = api.client.get("/openapi.json").json()["components"]["schemas"]["JobProgress"]
    for field in ("device_step_time_s_estimate", "device_time_s_estimate"):
        assert "device" in progress["properties"][field]["description"]
