"""Devices and the planner over HTTP: in this process (the fast tier), and the subprocess
printing its URL and key."""

from __future__ import annotations


def test_serve_prints_its_url_and_key(service):
    log = service.output.read_text()
    assert service.url in log and service.api_key in log


def test_every_v1_route_wants_the_key(api):
    assert api.request("GET", "/v1/devices", key=None)[0] == 401
    status, body = api.request("GET", "/v1/devices", key="wrong-key-456")
    assert status == 401 and "API key" in body["detail"]


def test_devices_are_served_with_their_sources(api):
    status, body = api.request("GET", "/v1/devices")
    assert status == 200 and body["count"] == len(body["data"]) >= 9
    by_id = {d["id"]: d for d in body["data"]}
    assert by_id["iphone-15-pro-max"]["budget_mb"] == 1024 and by_id["iphone-15-pro-max"]["sources"]
    status, one = api.request("GET", "/v1/devices/pixel-8")
    assert status == 200 and one == by_id["pixel-8"]
    assert api.request("GET", "/v1/devices/nokia-3310")[0] == 404


def test_a_plan_on_a_device_has_the_front_auto_and_estimates(api, check_front):
    status, plan = api.request("POST", "/v1/plans", {
        "model": "preset:qwen2.5-0.5b", "seq_len": 256, "device": "iphone-15-pro-max"})
    assert status == 200, plan
    assert plan["budget_mb"] == 1024 and plan["feasible"] is True
    assert plan["calibration"]["allocator"] in ("glibc", "jemalloc")  # whose heap is counted
    by_id = {c["id"]: c for c in plan["configurations"]}
    auto = by_id[plan["auto"]]
    assert auto["feasible"] and auto["device_step_time_s_estimate"] > 0
    check_front(plan)
    # the phone's time moves with every knob, and MeZO (two forwards) is estimated beside it
    estimates = {c["device_step_time_s_estimate"] for c in plan["configurations"]}
    assert len(estimates) > 0.8 * len(plan["configurations"])
    assert 0 < plan["device_mezo_step_time_s_estimate"] < min(estimates)
    assert plan["device"]["memory_gb_s"] > 0


def test_an_infeasible_budget_names_the_smallest_that_fits(api):
    status, plan = api.request("POST", "/v1/plans", {
        "model": "preset:qwen2.5-0.5b", "seq_len": 256, "memory_budget_mb": 100})
    assert status == 200
    assert plan["feasible"] is False and plan["auto"] is None
    smallest = plan["smallest_budget_mb"]
    status, retry = api.request("POST", "/v1/plans", {
        "model": "preset:qwen2.5-0.5b", "seq_len": 256, "memory_budget_mb": smallest})
    assert retry["feasible"] is True


def test_every_method_is_planned_side_by_side(api, check_front):
    """``method=all``: each method's plan, labelled, with its own front, and the method to
    run; MeZO's and backprop's plans say what they hold and whether a phone budget fits."""
    query = {"model": "preset:qwen2.5-0.5b", "seq_len": 256, "device": "iphone-15-pro-max",
             "method": "all"}
    response = api.client.get("/v1/plans", params=query)
    assert response.status_code == 200, response.text
    plans = response.json()
    assert plans["method"] == "all" and set(plans["plans"]) == {"mebp", "mezo", "backprop"}
    for method, plan in plans["plans"].items():
        assert plan["method"] == method
        assert all(c["method"] == method for c in plan["configurations"])
        check_front(plan)
    mezo, backprop = plans["plans"]["mezo"], plans["plans"]["backprop"]
    assert mezo["feasible"] and all(c["memory_mb"]["checkpoints"] == 0
                                    for c in mezo["configurations"])
    assert backprop["feasible"] is False and backprop["smallest_budget_mb"] > 1024
    assert plans["recommendation"]["method"] == "mebp"
    assert plans["recommendation"]["configuration"] == \
        plans["plans"]["mebp"]["recommendation"]["configuration"]
    status, one = api.request("POST", "/v1/plans", {**query, "method": "mezo"})
    assert status == 200 and one == mezo
    status, adamw = api.request("POST", "/v1/plans", {**query, "method": "mezo",
                                                       "optimizer": "adamw"})
    assert status == 422 and adamw["detail"][0]["loc"] == ["body", "method"], adamw


def test_bad_fields_get_422_naming_the_field(api):
    cases = [({"model": "preset:nope"}, "model"),
             ({"model": "gpt2"}, "model"),
             ({"model": "preset:tiny", "seq_len": 1}, "seq_len"),
             ({"model": "preset:tiny", "seq_len": 100000}, "seq_len"),
             ({"model": "preset:tiny", "device": "nokia-3310"}, "device"),
             ({"model": "preset:tiny", "lora_targets": "q,zz"}, "lora_targets"),
             ({"model": "preset:tiny", "memory_budget_mb": -1}, "memory_budget_mb"),
             ({"model": "preset:tiny", "surprise": 1}, "surprise"),
             ({"model": "preset:tiny", "method": "sgd"}, "method")]
    for body, field in cases:
        status, answer = api.request("POST", "/v1/plans", body)
        assert status == 422, (body, answer)
        assert any(field in map(str, error["loc"]) for error in answer["detail"]), answer


def test_the_recommendation_trades_at_most_the_time_tolerance_for_memory(api):
    """At 1024 MB the fastest configuration holds about 842 MB; the recommendation is the
    smallest within ``time_tolerance`` (3% by default) of it, saying so; ``auto`` stays the
    fastest. A tolerance out of range is a 422 naming it, in a body or a query."""
    query = {"model": "preset:qwen2.5-0.5b", "seq_len": 256, "device": "iphone-15-pro-max"}
    status, plan = api.request("POST", "/v1/plans", query)
    assert status == 200, plan
    by_id = {c["id"]: c for c in plan["configurations"]}
    fastest = by_id[plan["auto"]]
    recommendation = plan["recommendation"]
    chosen = by_id[recommendation["configuration"]]
    assert plan["time_tolerance"] == 0.03 and chosen["id"] != fastest["id"]
    within = [c for c in plan["configurations"] if c["feasible"] and
              c["device_step_time_s_estimate"] <= 1.03 * fastest["device_step_time_s_estimate"]]
    assert chosen in within and chosen["peak_mb"] < fastest["peak_mb"]
    assert chosen["peak_mb"] == min(c["peak_mb"] for c in within)
    assert recommendation["why"].startswith(
        f"smallest within 3% of the fastest that fits "
        f"({fastest['device_step_time_s_estimate']:.3g} s/step at {fastest['peak_mb']:.0f} MB)")
    assert plan["largest_fitting_peak_mb"] == round(1024 / 1.1, 1)
    response = api.client.get("/v1/plans", params={**query, "time_tolerance": 0})
    assert response.status_code == 200, response.text
    assert response.json()["recommendation"]["configuration"] == plan["auto"]
    for tolerance in (-0.01, 0.9):
        status, answer = api.request("POST", "/v1/plans", {**query, "time_tolerance": tolerance})
        assert status == 422 and answer["detail"][0]["loc"] == ["body", "time_tolerance"]
    response = api.client.get("/v1/plans", params={**query, "time_tolerance": "fast"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "time_tolerance"]


def test_a_plan_from_query_parameters_matches_the_post(api):
    query = {"model": "preset:smollm2-135m", "device": "pixel-8", "seq_len": 128}
    response = api.client.get("/v1/plans", params=query)
    assert response.status_code == 200
    assert response.json() == api.request("POST", "/v1/plans", query)[1]
    response = api.client.get("/v1/plans", params={**query, "device": "nokia-3310"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "device"]


def test_the_openapi_document_describes_every_route(api):
    status, spec = api.request("GET", "/openapi.json", key=None)
    assert status == 200
    paths = {path: set(methods) for path, methods in spec["paths"].items()}
    expected = {
        "/v1/devices": {"get"}, "/v1/devices/{device_id}": {"get"},
        "/v1/plans": {"get", "post"}, "/v1/datasets": {"get", "post"},
        "/v1/datasets/{dataset_id}": {"get"}, "/v1/jobs": {"get", "post"},
        "/v1/jobs/{job_id}": {"get"}, "/v1/jobs/{job_id}/cancel": {"post"},
        "/v1/jobs/{job_id}/events": {"get"}, "/v1/jobs/{job_id}/metrics": {"get"},
        "/v1/jobs/{job_id}/adapter": {"get"}, "/v1/fleets": {"get", "post"},
        "/v1/fleets/{fleet_id}": {"get"}, "/v1/fleets/{fleet_id}/members": {"get"},
        "/v1/fleets/{fleet_id}/rounds": {"get"}, "/v1/health": {"get"}}
    for path, methods in expected.items():
        assert methods <= paths.get(path, set()), path
    schemas = spec["components"]["schemas"]
    # the knobs are TrainConfig's own: every field, described as on the command line
    from mebp_core.config import EngineKnobs
    knobs = schemas["EngineKnobs"]["properties"]
    for name, field in EngineKnobs.model_fields.items():
        assert knobs[name]["description"] == field.description, name
    # ...and so are the hyperparameters: every TrainConfig field a job does not carry
    # elsewhere, with the field's own description (lr under its public name)
    from mebp_core.config import TrainConfig
    hyper = schemas["Hyperparameters"]["properties"]
    elsewhere = {"schema_version", "knobs", "method", "seed", "lr", "validation_fraction",
                 "skip_malformed", "checkpoint_every", "data_start_batch"}
    for name, field in TrainConfig.model_fields.items():
        if name not in elsewhere and name != "lora_targets":
            assert hyper[name]["description"] == field.description, name
    assert hyper["learning_rate"]["description"] == TrainConfig.model_fields["lr"].description
    for name in ("PlanPublic", "JobCreate", "JobPublic", "Hyperparameters", "EngineKnobs",
                 "DatasetPublic", "FleetCreate", "FleetPublic", "EventPublic"):
        assert name in schemas, name
    assert {"status", "progress", "error", "enforcement", "plan", "config"} <= \
        set(schemas["JobPublic"]["properties"])


def test_a_job_of_any_method_is_planned_and_refused_when_nothing_fits(api):
    """MeZO gets a plan and the configuration it runs; plain backprop on a phone budget is
    refused with the smallest budget that fits instead of being accepted and killed."""
    dataset = api.upload("train.jsonl", b'{"text": "hello there"}\n' * 4)[1]["id"]
    job = {"model": "preset:qwen2.5-0.5b", "training_file": dataset,
           "device": "iphone-15-pro-max", "hyperparameters": {"seq_len": 256}}
    status, mezo = api.request("POST", "/v1/jobs", {**job, "method": "mezo"})
    assert status == 201, mezo
    assert mezo["plan"]["planned"] is True and mezo["plan"]["method"] == "mezo"
    assert mezo["plan"]["configuration"].startswith("mezo-")
    assert mezo["plan"]["device_step_time_s_estimate"] > 0
    assert mezo["config"]["knobs"]["frozen_weights"] in ("lazy", "resident")
    status, refused = api.request("POST", "/v1/jobs", {**job, "method": "backprop"})
    assert status == 422, refused
    error = refused["detail"][0]
    assert error["loc"] == ["body", "memory_budget_mb"] and error["smallest_budget_mb"] > 1024
    status, allowed = api.request("POST", "/v1/jobs", {**job, "method": "backprop",
                                                       "memory_budget_mb": error[
                                                           "smallest_budget_mb"]})
    assert status == 201 and allowed["plan"]["configuration"] == "backprop", allowed
