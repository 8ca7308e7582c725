"""Attacks on what the API accepts, from an adversarial run, on both databases (SQLite and
PostgreSQL; in process, and as the real service where a job must run): non-finite numbers,
unbounded fields, booleans for counts, NUL characters (which PostgreSQL cannot store), a
diverging job, and registered models escaping the model roots."""

from __future__ import annotations

import json

import pytest

ROWS = b'{"text": "an attack becomes a test"}\n' * 4
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e999")


@pytest.fixture
def dataset(any_api) -> str:
    status, body = any_api.upload("rows.jsonl", ROWS)
    assert status == 201, body
    return body["id"]


@pytest.fixture
def service_dataset(any_service) -> str:
    status, body = any_service.upload("rows.jsonl", ROWS)
    assert status == 201, body
    return body["id"]


def post_raw(service, path: str, text: str):
    """A body the json module would refuse to write: the literal NaN or Infinity."""
    return service.client.post(path, content=text.encode(),
                               headers={"Content-Type": "application/json"})


def job_body(dataset: str, **fields) -> dict:
    return {"model": "preset:tiny", "training_file": dataset, "device": "pixel-8", **fields}


@pytest.mark.parametrize("where", [
    ("hyperparameters", "learning_rate"), ("hyperparameters", "lora_alpha"),
    ("hyperparameters", "weight_decay"), ("memory_budget_mb",),
    ("hyperparameters", "max_grad_norm")])
def test_non_finite_numbers_in_a_job_are_422s_naming_the_field(any_api, dataset, where):
    for literal in NON_FINITE:
        body = job_body(dataset)
        target = body
        for key in where[:-1]:
            target = target.setdefault(key, {})
        target[where[-1]] = "__VALUE__"
        response = post_raw(any_api, "/v1/jobs",
                            json.dumps(body).replace('"__VALUE__"', literal))
        assert response.status_code == 422, (literal, response.text)
        assert response.json()["detail"][0]["loc"] == ["body", *where], response.text
    assert any_api.client.get("/v1/jobs?limit=1000").status_code == 200


def test_non_finite_numbers_in_plans_and_devices_are_422s(any_api):
    for literal in NON_FINITE:
        plan = post_raw(any_api, "/v1/plans",
                        f'{{"model": "preset:tiny", "seq_len": 32, "margin": {literal}}}')
        assert plan.status_code == 422 and plan.json()["detail"][0]["loc"] == ["body", "margin"]
        device = post_raw(any_api, "/v1/devices",
                          '{"id": "nan-phone", "name": "N", "budget_mb": 512, '
                          f'"relative_compute": {literal}}}')
        assert device.status_code == 422, device.text
        assert device.json()["detail"][0]["loc"] == ["body", "relative_compute"]
    query = any_api.client.get("/v1/plans", params={"model": "preset:tiny",
                                                    "memory_budget_mb": "nan"})
    assert query.status_code == 422
    assert query.json()["detail"][0]["loc"] == ["query", "memory_budget_mb"]


def test_a_job_whose_loss_diverges_fails_and_keeps_no_adapter(any_service, service_dataset):
    status, job = any_service.request("POST", "/v1/jobs", job_body(
        service_dataset, hyperparameters={"steps": 300, "seq_len": 32, "learning_rate": 10.0,
                                          "weight_decay": 10.0}))
    assert status == 201, job
    done = any_service.finished(job["id"], timeout_s=300)
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "training_diverged" and "diverged" in \
        done["error"]["message"]
    assert done["adapter"] is None
    assert any_service.client.get(f"/v1/jobs/{job['id']}/adapter").status_code in (404, 409)
    metrics = any_service.client.get(f"/v1/jobs/{job['id']}/metrics").json()["data"]
    assert metrics and all(row["loss"] is not None for row in metrics)


@pytest.mark.parametrize("change, loc", [
    ({"metadata": {"k": "x" * 1025}}, ["body", "metadata", "k"]),
    ({"metadata": {"k" * 65: "v"}}, ["body", "metadata", "k" * 65, "[key]"]),
    ({"metadata": {f"k{i}": "v" for i in range(33)}}, ["body", "metadata"]),
    ({"hyperparameters": {"steps": True}}, ["body", "hyperparameters", "steps"]),
    ({"hyperparameters": {"lora_targets": ["q_proj"] * 17}},
     ["body", "hyperparameters", "lora_targets"]),
    ({"device": "d" * 257}, ["body", "device"]),
])
def test_free_form_fields_are_bounded(any_api, dataset, change, loc):
    status, body = any_api.request("POST", "/v1/jobs", {**job_body(dataset), **change})
    assert status == 422, body
    assert any(error["loc"][:len(loc)] == loc for error in body["detail"]), body
    assert len(json.dumps(body)) < 8192  # the refusal does not echo a huge input back


def test_engine_threads_are_bounded(any_api, dataset):
    status, body = any_api.request("POST", "/v1/jobs", job_body(
        dataset, method="backprop", config={"threads": 100_000}))
    assert status == 422
    assert any(error["loc"][-1] == "threads" for error in body["detail"]), body
    assert any_api.request("POST", "/v1/jobs", job_body(
        dataset, config={"threads": True}))[0] == 422


@pytest.mark.parametrize("field", ["device", "training_file", "validation_file", "model"])
def test_nul_in_a_job_field_is_the_same_422_on_every_database(any_api, dataset, field):
    body = job_body(dataset)
    body[field] = body.get(field, dataset) + "\x00"
    status, error = any_api.request("POST", "/v1/jobs", body)
    assert status == 422, error
    assert error["detail"][0]["loc"] == ["body", field]


@pytest.mark.parametrize("path", ["/v1/jobs/job-%00", "/v1/datasets/ds-%00",
                                  "/v1/devices/x%00", "/v1/jobs/job-%00/events",
                                  "/v1/fleets/fl-%00"])
def test_nul_in_a_path_id_is_a_404_on_every_database(any_api, path):
    response = any_api.client.get(path)
    assert response.status_code == 404, response.text


def test_nul_in_an_upload_filename_is_dropped_on_every_database(any_api):
    # written by hand: httpx would percent-encode the NUL
    body = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="rows\x00.jsonl"'
            b"\r\nContent-Type: application/octet-stream\r\n\r\n" + ROWS + b"\r\n--b--\r\n")
    response = any_api.client.post("/v1/datasets", content=body, headers={
        "Content-Type": "multipart/form-data; boundary=b"})
    assert response.status_code == 201, response.text
    assert response.json()["filename"] == "rows.jsonl"


def test_nul_in_a_plan_query_is_a_422_on_every_database(any_api):
    response = any_api.client.get("/v1/plans?model=preset:tiny%00&seq_len=32")
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", "model"]
    assert any_api.client.get("/v1/plans?model=preset:tiny&device=pixel-8%00"
                                  ).status_code == 422


def test_registered_models_cannot_reach_outside_the_roots(api, model_root, tmp_path):
    """A directory inside the roots whose config.json (or weights) is a symlink to a file
    outside them; a symlink loop; a NUL; an over-long path component."""
    outside = tmp_path / "secret.json"
    outside.write_text((model_root / "tiny-hf" / "config.json").read_text())
    sneaky = model_root / "sneaky"
    sneaky.mkdir()
    for entry in (model_root / "tiny-hf").iterdir():
        if entry.name != "config.json":
            (sneaky / entry.name).symlink_to(entry)
    (sneaky / "config.json").symlink_to(outside)
    loop = model_root / "loop"
    loop.symlink_to(loop)
    for path in (str(sneaky), str(loop), str(model_root / "tiny-hf") + "\x00",
                 str(model_root / ("x" * 300))):
        status, error = api.request("POST", "/v1/models", {"name": "bad", "path": path})
        assert status == 422, (path, error)
        assert error["detail"][0]["loc"] == ["body", "path"], error


def test_a_registered_model_changed_to_reach_outside_fails_its_job(service, model_root,
                                                                   tmp_path):
    """Checked at registration and again by the worker before it reads a byte."""
    import shutil

    swapped = model_root / "swapped"
    shutil.copytree(model_root / "tiny-hf", swapped)
    status, _ = service.request("POST", "/v1/models", {"name": "swapped",
                                                       "path": str(swapped)})
    assert status == 201
    outside = tmp_path / "config.json"
    outside.write_text((swapped / "config.json").read_text())
    (swapped / "config.json").unlink()
    (swapped / "config.json").symlink_to(outside)
    status, dataset = service.upload("rows.jsonl", ROWS)
    status, job = service.request("POST", "/v1/jobs", {
        "model": "swapped", "training_file": dataset["id"], "device": "pixel-8",
        "hyperparameters": {"steps": 2, "seq_len": 32}})
    assert status == 201, job
    done = service.finished(job["id"])
    assert done["status"] == "failed" and done["error"]["code"] == "invalid_input", done
    assert "outside the model roots" in done["error"]["message"]
