"""Federated fleets end to end on the real service: devices train in rounds on their own
shards, each round's global adapter is the examples-weighted average of the updates that
finished, the next round starts from it, the references train beside it, the fleet's page
shows it all; bad settings are 422s naming the field."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import pytest
import torch
from dashboard_harness import chart_traces, labels_outside_plot, open_page, shoot, sign_in
from playwright.sync_api import expect
from service_harness import Service

USERS = ("ada", "bob", "cy", "dee")
ROWS = b"".join(json.dumps({"text": f"{user} writes note {i} about the lazy dog",
                            "user": user}).encode() + b"\n"
                for i in range(36) for user in USERS[: 1 + i % 4])
VALIDATION = b"".join(json.dumps({"text": f"a held-out note {i}"}).encode() + b"\n"
                      for i in range(6))
DEVICES, ROUNDS, LOCAL_STEPS = 2, 2, 2
DEVICE_VALIDATION_ROWS = 2  # the ffa fleet's device jobs score a sample; fedavg's none
FLEET = {"model": "preset:tiny", "simulated": {"device": "iphone-15-pro-max", "count": DEVICES},
         "hyperparameters": {"steps": 2, "seq_len": 32, "learning_rate": 0.05},
         "aggregation": "fedavg", "rounds": ROUNDS, "local_steps": LOCAL_STEPS, "seed": 1,
         "data_split": {"kind": "by_field", "field": "user"}}


@dataclass
class FinishedFleet:
    service: Service
    training: str  # the training file's dataset id
    fleet: dict  # after its last round and its references


@pytest.fixture(scope="module", params=["embedded-fedavg", "shared-ffa"])
def finished_fleet(request) -> FinishedFleet:
    """One fleet with its references run to the end per deployment, read by the tests below:
    fedavg on the embedded service, ffa on the machine's PostgreSQL and Redis."""
    deployment, aggregation = request.param.split("-")
    service = request.getfixturevalue("service" if deployment == "embedded"
                                      else "shared_service")
    training = service.upload("notes.jsonl", ROWS)[1]["id"]
    validation = service.upload("held-out.jsonl", VALIDATION)[1]["id"]
    sample = {"device_validation_rows": DEVICE_VALIDATION_ROWS} if aggregation == "ffa" else {}
    status, fleet = service.request("POST", "/v1/fleets", {
        **FLEET, "aggregation": aggregation, "training_file": training,
        "validation_file": validation, "references": True, **sample})
    assert status == 201, fleet
    assert fleet["aggregation"] == aggregation and len(fleet["members"]) == DEVICES
    assert (fleet["planned_rounds"], fleet["local_steps"]) == (ROUNDS, LOCAL_STEPS)
    service.fleet_after_rounds(fleet["id"], ROUNDS)
    return FinishedFleet(service, training, service.fleet_when(
        fleet["id"], lambda f: f["references"]["centralized"] is not None
        and f["references"]["local_only_mean"] is not None, "the references"))


def test_a_fleet_trains_in_rounds_from_each_global_adapter(finished_fleet):
    service, fleet = finished_fleet.service, finished_fleet.fleet
    shards = [service.request("GET", f"/v1/datasets/{m['training_file']}")[1]
              for m in fleet["members"]]
    assert sum(shard["rows"] for shard in shards) == ROWS.count(b"\n")
    first, second = fleet["rounds"]
    for current in (first, second):
        assert current["status"] == "done", current
        assert [p["outcome"] for p in current["participants"]] == ["trained"] * DEVICES
        assert current["eval_loss"] > 0 and current["simulated_wall_s"] > 0
    assert second["eval_loss"] != first["eval_loss"]

    # round 0's global adapter is its updates' average, weighted by their shards' rows (for
    # ffa, whose devices share one frozen A, that average is the shared A itself)
    updates = [(service.adapter_tensors(f"/v1/jobs/{p['job_id']}/adapter"), p["examples"])
               for p in first["participants"]]
    total = sum(examples for _, examples in updates)
    combined = service.adapter_tensors(f"/v1/fleets/{fleet['id']}/rounds/0/adapter")
    for name, tensor in combined.items():
        expected = sum(update[name].double() * examples / total for update, examples in updates)
        torch.testing.assert_close(tensor, expected.float(), rtol=1e-6, atol=1e-7)
        if fleet["aggregation"] == "ffa" and "lora_A" in name:
            assert all(torch.equal(update[name], tensor) for update, _ in updates), name
    # round 1's jobs started from it
    for participant in second["participants"]:
        events = service.job_events(participant["job_id"])
        assert any(e["message"] == f"starting from fleet {fleet['id']}'s round-0 global "
                   "adapter" for e in events), events
    response = service.client.get(f"/v1/fleets/{fleet['id']}/rounds/1/adapter",
                                  params={"format": "gguf"})
    assert response.status_code == 200 and response.content[:4] == b"GGUF"
    response = service.client.get(f"/v1/fleets/{fleet['id']}/rounds/1/adapter",
                                  params={"format": "mlx"})
    assert response.status_code == 200 and any(
        name.endswith("adapters.safetensors")
        for name in zipfile.ZipFile(io.BytesIO(response.content)).namelist())
    assert service.client.get(f"/v1/fleets/{fleet['id']}/rounds/2/adapter").status_code == 404


def test_the_references_train_each_device_alone_and_one_run_on_everything(finished_fleet):
    """Each device alone on its shard for the rounds' steps, and one run on all rows seeing
    every round's devices' examples, scored on the validation set."""
    service, fleet = finished_fleet.service, finished_fleet.fleet
    references = fleet["references"]
    local = [run for run in references["runs"] if run["kind"] == "local_only"]
    [central] = [run for run in references["runs"] if run["kind"] == "centralized"]
    assert [run["member"] for run in local] == list(range(DEVICES))
    assert [run["steps"] for run in local] == [ROUNDS * LOCAL_STEPS] * DEVICES
    assert central["steps"] == ROUNDS * DEVICES * LOCAL_STEPS
    for run in (*local, central):
        job = service.request("GET", f"/v1/jobs/{run['job_id']}")[1]
        expected_file = finished_fleet.training if run is central else \
            fleet["members"][run["member"]]["training_file"]
        assert job["status"] == "succeeded" and job["training_file"] == expected_file, job
        assert job["progress"]["total_steps"] == run["steps"] and job["fleet_id"] == fleet["id"]
        # its validation loss after its last step, on the fleet's validation set
        metrics = service.request("GET", f"/v1/jobs/{run['job_id']}/metrics")[1]["data"]
        assert run["eval_loss"] == metrics[-1]["data"]["val_loss"] > 0
    assert references["local_only_mean"] == pytest.approx(
        sum(run["eval_loss"] for run in local) / DEVICES)
    assert central["eval_loss"] != references["local_only_mean"]


def test_device_jobs_score_no_validation_file_or_the_fleets_sample(finished_fleet):
    """The global adapter is scored once per round; a device's job only on the fleet's
    bounded sample, if it sets one."""
    service, fleet = finished_fleet.service, finished_fleet.fleet
    sampled = fleet["aggregation"] == "ffa"
    for current in fleet["rounds"]:
        assert current["eval_loss"] is not None
        for seat in current["participants"]:
            job = service.request("GET", f"/v1/jobs/{seat['job_id']}")[1]
            assert (job["validation_file"] is not None) == sampled, job
            assert job["config"]["validation_rows"] == \
                (DEVICE_VALIDATION_ROWS if sampled else None)
            last = service.request("GET", f"/v1/jobs/{seat['job_id']}/metrics")[1]["data"][-1]
            assert ("val_loss" in last["data"]) == sampled, last


def test_the_fleet_page_shows_each_round_and_who_took_part(chromium, finished_fleet):
    """Global validation loss per round beside the references, each device's fate per round,
    simulated time, and each device's loss through every round."""
    service, fleet = finished_fleet.service, finished_fleet.fleet
    with open_page(chromium, service.url) as page:
        sign_in(page, service.api_key)
        page.goto(f"/fleets/{fleet['id']}")
        expect(page.locator("#fleet-status")).to_have_text("The fleet is done.")
        expect(page.locator("#fleet-loss")).to_have_text(
            f"Global validation loss {fleet['rounds'][-1]['eval_loss']:.4f} (round 1's global "
            "adapter on the validation set).")
        expect(page.locator("#rounds-summary")).to_contain_text("2 of 2 rounds, ")
        grid = page.locator("#participation tbody tr[data-device]")
        expect(grid).to_have_count(DEVICES)
        for index in range(DEVICES):
            expect(grid.nth(index).locator(".badge")).to_have_text(["trained", "trained"])
        expect(page.locator("#participation .round-loss a")).to_have_count(2)  # the adapters
        curve, local, central = chart_traces(page, "round-chart")
        assert curve["x"] == [0, 1]
        assert round_axis_range(page)[0] > -1
        assert curve["y"] == pytest.approx([r["eval_loss"] for r in fleet["rounds"]])
        references = fleet["references"]
        assert local["name"].startswith("local-only")
        assert central["name"].startswith("centralized")
        assert local["y"] == pytest.approx([references["local_only_mean"]] * 2)
        assert central["y"] == pytest.approx([references["centralized"]] * 2)
        expect(page.locator("#references a")).to_have_count(DEVICES + 1)  # and centralized
        expect(page.locator("#reference-schedule")).to_have_text("Reference runs: done")
        # each device's loss runs through both rounds: steps 1-2, a break, then 3-4
        devices = chart_traces(page, "loss-chart")
        assert len(devices) == DEVICES
        for device in devices:
            assert device["x"] == [1, 2, None, 3, 4], device
        assert labels_outside_plot(page, "budget-chart") == []
        shoot(page, f"fleet-{fleet['aggregation']}")


def test_a_fleet_page_reads_running_then_cancelled_and_draws_no_empty_chart(
        chromium, service, cancel_at_end):
    """While a long job holds the one worker, the fleet just made is running, and its page
    draws no chart without a point (no axes from -1). Cancelled in round 0, it runs until
    that round ends, then reads cancelled after 1 of 3 rounds (not "so far"), its header
    naming round 0's global validation loss."""
    training = service.upload("notes.jsonl", ROWS)[1]["id"]
    validation = service.upload("held-out.jsonl", VALIDATION)[1]["id"]
    status, blocker = service.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": training, "device": "pixel-8",
        "hyperparameters": {"steps": 100_000, "seq_len": 32}})
    assert status == 201, blocker
    cancel_at_end(service, blocker["id"])
    service.wait_for(blocker["id"], lambda job: job["status"] == "running")
    status, fleet = service.request("POST", "/v1/fleets", {
        **FLEET, "rounds": 3, "training_file": training, "validation_file": validation})
    assert status == 201 and fleet["status"] == "running", fleet
    with open_page(chromium, service.url) as page:
        sign_in(page, service.api_key)
        page.goto(f"/fleets/{fleet['id']}")
        expect(page.locator("#fleet-status")).to_have_text(
            "The fleet is running: 0 of 3 rounds ended.")
        expect(page.locator("#fleet-loss")).to_have_text(
            "No global validation loss: no round is done yet.")
        for chart in ("round-chart", "loss-chart", "budget-chart"):
            expect(page.locator(f"#{chart}-note")).to_be_visible()
        expect(page.locator(".main-svg")).to_have_count(0)  # no axes anywhere
        shoot(page, "fleet-running")

        assert service.request("POST", f"/v1/fleets/{fleet['id']}/cancel")[0] == 200
        page.reload()
        expect(page.locator("#fleet-status")).to_have_text(
            "The fleet is running: cancel requested, no round starts after round 0.")
        service.request("POST", f"/v1/jobs/{blocker['id']}/cancel")
        fleet = service.fleet_when(fleet["id"], lambda f: f["status"] != "running",
                                   "round 0, in progress at the cancel")
        assert fleet["status"] == "cancelled", fleet
        assert [r["status"] for r in fleet["rounds"]] == ["done"]
        page.reload()
        expect(page.locator("#fleet-status")).to_have_text(
            "The fleet is cancelled: after 1 of 3 rounds, keeping round 0's global adapter.")
        expect(page.locator("#rounds-summary")).to_contain_text("1 of 3 rounds (cancelled), ")
        expect(page.locator("#fleet-loss")).to_have_text(
            f"Global validation loss {fleet['rounds'][0]['eval_loss']:.4f} (round 0's global "
            "adapter on the validation set).")
        curve, = chart_traces(page, "round-chart")
        assert curve["x"] == [0] and round_axis_range(page)[0] > -1
        shoot(page, "fleet-cancelled")


def round_axis_range(page) -> list[float]:
    return page.evaluate("document.getElementById('round-chart')._fullLayout.xaxis.range")


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"aggregation": "none"}, ["body", "rounds"], "rounds needs aggregation fedavg or ffa"),
    ({"aggregation": "none", "rounds": 1, "local_steps": None, "references": True},
     ["body", "references"], "references needs aggregation fedavg or ffa"),
    ({"references": True}, ["body", "references"], "references need validation_file"),
    ({"references": True, "validation_file": "ds_any", "local_steps": 100_000, "rounds": 100},
     ["body", "references"], "would train 20000000 steps, more than 1000000"),
    ({"participation": 0}, ["body", "participation"], "greater than 0"),
    ({"rounds": 101}, ["body", "rounds"], "less than or equal to 100"),
    ({"data_split": {"kind": "by_field", "field": "team"}}, ["body", "data_split", "field"],
     "line 1: no field 'team'"),
    ({"data_split": {"kind": "dirichlet", "field": "user"}}, ["body", "data_split"],
     "alpha goes with dirichlet"),
    ({"device_validation_rows": 0}, ["body", "device_validation_rows"], "greater than or"),
    ({"device_validation_rows": 3}, ["body", "device_validation_rows"],
     "samples validation_file, which is not set"),
    ({"aggregation": "none", "rounds": 1, "local_steps": None, "device_validation_rows": 3},
     ["body", "device_validation_rows"], "needs aggregation fedavg or ffa"),
    # the request keeps forbidding a key it does not know (stored rows ignore one)
    ({"deadline": 5}, ["body", "deadline"], "Extra inputs are not permitted"),
])
def test_federated_settings_that_cannot_work_are_422s_naming_the_field(api, change, field,
                                                                       words):
    training = api.upload("notes.jsonl", ROWS)[1]["id"]
    status, body = api.request("POST", "/v1/fleets",
                               {**FLEET, **change, "training_file": training})
    assert status == 422, body
    [error] = body["detail"]
    assert error["loc"] == field and words in error["msg"], error


def test_a_fleets_model_is_resolved_once_for_all_its_devices(api, monkeypatch):
    """Checking the request's references resolves the model; every device's plan reuses it."""
    import app.api.model_lookup as lookup
    resolved = []
    real = lookup.model_architecture
    monkeypatch.setattr(lookup, "model_architecture",
                        lambda session, name: resolved.append(name) or real(session, name))
    training = api.upload("notes.jsonl", ROWS)[1]["id"]
    status, body = api.request("POST", "/v1/fleets", {
        **FLEET, "training_file": training,
        "devices": ["iphone-15-pro-max", "pixel-8"], "simulated": None})
    assert status == 201, body
    assert resolved == ["preset:tiny"]
