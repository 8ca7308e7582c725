"""The admin scope: registering models (confined to the model roots) and adding device
profiles; other keys get 403 (in process), and what admins add trains for every tenant (on a
real `mebp serve` with its worker)."""

from __future__ import annotations

import httpx
import pytest
from service_harness import create_key

ROWS = b'{"text": "registered models train too"}\n' * 4
PROFILE = {"id": "pixel-9a", "name": "Pixel 9a", "ram_mb": 8192, "budget_mb": 900,
           "relative_compute": 0.5, "sources": ["https://store.google.com/"]}


def user_client(service) -> httpx.Client:
    """A client of a tenant with a plain user key."""
    client = service.anonymous()
    client.headers["Authorization"] = f"Bearer {create_key(service, 'beta')}"
    return client


@pytest.fixture(scope="module")
def user(api):
    with user_client(api) as client:
        yield client


def test_only_admins_register_models_and_only_from_the_model_roots(api, user, model_root,
                                                                   tmp_path):
    good = {"name": "my-tiny", "path": str(model_root / "tiny-hf")}
    assert user.post("/v1/models", json=good).status_code == 403
    (model_root / "escape").symlink_to(tmp_path)
    (model_root / "empty").mkdir()
    for path in ("/etc", str(model_root / ".." / "elsewhere"), str(model_root / "escape"),
                 str(model_root / "empty")):
        status, error = api.request("POST", "/v1/models", {"name": "bad", "path": path})
        assert status == 422 and error["detail"][0]["loc"] == ["body", "path"], (path, error)
    status, model = api.request("POST", "/v1/models", good)
    assert status == 201, model
    assert model["source"] == "registered" and model["parameters"] > 0
    assert api.request("POST", "/v1/models", good)[0] == 409
    listed = {m["name"]: m for m in user.get("/v1/models").json()["data"]}
    assert listed["my-tiny"]["source"] == "registered"
    assert listed["preset:tiny"]["source"] == "preset"
    # the shipped preset is the one that learned something; the rest are seeded noise
    assert {name for name, m in listed.items() if m["pretrained"]} == {"preset:pycode-12m"}
    assert listed["preset:tiny"]["pretrained"] is False and listed["my-tiny"]["pretrained"] is None
    dataset = user.post("/v1/datasets", files={"file": ("r.jsonl", ROWS)}).json()["id"]
    response = user.post("/v1/jobs", json={"model": "nobody-registered-me",
                                           "training_file": dataset, "device": "pixel-8"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "model"]


def test_only_admins_add_device_profiles_which_every_tenant_can_use(api, user):
    assert user.post("/v1/devices", json=PROFILE).status_code == 403
    status, error = api.request("POST", "/v1/devices", {**PROFILE, "id": "Pixel 9a!"})
    assert status == 422 and error["detail"][0]["loc"] == ["body", "id"]
    status, device = api.request("POST", "/v1/devices", PROFILE)
    assert status == 201 and device["budget_mb"] == 900
    assert device["effective_gflops_estimate"] > 0
    assert api.request("POST", "/v1/devices", PROFILE)[0] == 409
    assert user.get("/v1/devices/pixel-9a").json()["name"] == "Pixel 9a"
    dataset = user.post("/v1/datasets", files={"file": ("r.jsonl", ROWS)}).json()["id"]
    job = user.post("/v1/jobs", json={"model": "preset:tiny", "training_file": dataset,
                                      "device": "pixel-9a",
                                      "hyperparameters": {"steps": 1, "seq_len": 16}})
    assert job.status_code == 201 and job.json()["memory_budget_mb"] == 900
    assert job.json()["plan"]["device_step_time_s_estimate"] > 0


def test_a_registered_model_plans_and_trains_for_any_tenant_on_an_added_profile(service,
                                                                                 model_root):
    status, _ = service.request("POST", "/v1/models", {"name": "my-tiny",
                                                        "path": str(model_root / "tiny-hf")})
    assert status == 201, _
    assert service.request("POST", "/v1/devices", PROFILE)[0] == 201
    with user_client(service) as user:
        plan = user.get("/v1/plans", params={"model": "my-tiny", "device": "pixel-9a",
                                             "seq_len": 32})
        assert plan.status_code == 200 and plan.json()["feasible"] is True
        dataset = user.post("/v1/datasets", files={"file": ("r.jsonl", ROWS)}).json()["id"]
        job = user.post("/v1/jobs", json={"model": "my-tiny", "training_file": dataset,
                                          "device": "pixel-9a",
                                          "hyperparameters": {"steps": 2, "seq_len": 32}})
        assert job.status_code == 201, job.text
        done = service.finished(job.json()["id"], client=user)
    assert done["status"] == "succeeded" and done["memory_budget_mb"] == 900, done
