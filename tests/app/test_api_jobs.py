"""The service end to end over real HTTP, on the embedded defaults and on the machine's real
Redis and PostgreSQL: upload, submit on a device profile, follow the events, download the
adapter and load it with PEFT; the planner's 422; the kernel cap killing a job over its
budget while the worker keeps serving; cancel."""

from __future__ import annotations

import hashlib
import io
import json
import statistics
import zipfile
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.on_host import plan_on_host
from mebp_core.store.presets import save_preset_as_hf

ROWS = b"".join(json.dumps({"text": f"the quick brown fox {i} jumps over the lazy dog"})
                .encode() + b"\n" for i in range(32))
SMALL_JOB = {"model": "preset:tiny", "device": "iphone-15-pro-max",
             "hyperparameters": {"steps": 4, "seq_len": 64, "learning_rate": 0.05}}
# activations of seq 1024 x batch 8 need ~400 MB even at the smallest configuration (MLP
# in chunks: batch 4 now fits 300 MB)
# 8 sequences fitted 300 MB once the engines ran under jemalloc (its heap keeps fewer holes)
OVER_BUDGET_JOB = {"model": "preset:tiny", "memory_budget_mb": 300,
                   "hyperparameters": {"steps": 3, "seq_len": 1024, "batch_size": 24}}


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory):
    return save_preset_as_hf("tiny", tmp_path_factory.mktemp("tiny-hf") / "tiny")


def upload_rows(service, rows: bytes = ROWS) -> str:
    status, dataset = service.upload("train.jsonl", rows)
    assert status == 201, dataset
    assert dataset["rows"] == rows.count(b"\n")
    assert dataset["sha256"] == hashlib.sha256(rows).hexdigest()
    return dataset["id"]


def submit(service, body: dict, dataset_id: str) -> dict:
    status, job = service.request("POST", "/v1/jobs", {**body, "training_file": dataset_id})
    assert status == 201, job
    return job


def test_a_job_runs_under_its_device_budget_and_its_adapter_loads_in_peft(any_service,
                                                                          tiny_hf_dir,
                                                                          model_cache):
    service = any_service
    job = submit(service, SMALL_JOB, upload_rows(service))
    assert job["status"] == "queued" and job["device"] == "iphone-15-pro-max"
    assert job["memory_budget_mb"] == 1024 and job["plan"]["feasible"] is True

    events = list(service.events(job["id"]))
    steps = [data["step"] for kind, data in events if kind == "metric"]
    statuses = [data["status"] for kind, data in events if kind == "status"]
    assert steps == [1, 2, 3, 4]
    assert statuses == ["validating", "queued", "running", "succeeded"]
    assert events[-1] == ("end", {"status": "succeeded"})

    job = service.request("GET", f"/v1/jobs/{job['id']}")[1]
    assert job["status"] == "succeeded" and job["error"] is None
    assert job["enforcement"] in ("cgroup-v2", "cgroup-v1")
    progress = job["progress"]
    assert progress["step"] == progress["total_steps"] == 4 and progress["loss"] > 0
    assert 0 < progress["peak_memory_mb"] <= 1024
    assert progress["peak_anon_mb"] <= progress["peak_memory_mb"]  # charged: anon + shared
    assert progress["cgroup_peak_usage_mb"] > 0  # the cgroup's own counter, apart
    assert job["started_at"] <= job["finished_at"]
    metrics = service.request("GET", f"/v1/jobs/{job['id']}/metrics")[1]
    assert [m["step"] for m in metrics["data"]] == [1, 2, 3, 4]
    assert all(0 < m["data"]["peak_anon_mb"] <= m["data"]["peak_mb"] for m in metrics["data"])
    # measured by the job cgroup's own counters: its usage peak bounds the charged peak
    assert all(m["data"]["peak_mb"] <= m["data"]["cgroup_usage_peak_mb"]
               <= progress["cgroup_peak_usage_mb"] + 0.1 for m in metrics["data"])
    assert abs(progress["peak_memory_mb"] - metrics["data"][-1]["data"]["peak_mb"]) <= 0.1
    check_predicted_beside_measured(service, job, metrics["data"], model_cache)

    response = service.client.get(f"/v1/jobs/{job['id']}/adapter")
    assert response.status_code == 200 and response.headers["content-type"] == "application/zip"
    # the digest is of the exact bytes served, and the job's adapter names the same one
    assert response.headers["x-adapter-sha256"] == hashlib.sha256(response.content).hexdigest()
    assert response.headers["x-adapter-sha256"] == job["adapter"]["sha256"]
    adapter_dir = tiny_hf_dir.parent / f"adapter-{job['id']}"
    zipfile.ZipFile(io.BytesIO(response.content)).extractall(adapter_dir)
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_hf_dir),
                                      adapter_dir)
    loaded = {name: param for name, param in model.named_parameters() if "lora_" in name}
    assert len(loaded) == len(saved)
    for name, tensor in saved.items():
        peft_name = name.replace(".weight", ".default.weight")
        assert torch.equal(loaded[peft_name].detach(), tensor), name
    assert any(tensor.abs().sum() > 0 for name, tensor in saved.items() if "lora_B" in name)

    digests = {response.headers["x-adapter-sha256"]}
    for fmt, media in (("gguf", "application/octet-stream"), ("mlx", "application/zip")):
        response = service.client.get(f"/v1/jobs/{job['id']}/adapter", params={"format": fmt})
        assert response.status_code == 200 and response.headers["content-type"] == media
        assert len(response.content) > 1000
        digest = response.headers["x-adapter-sha256"]
        assert digest == hashlib.sha256(response.content).hexdigest(), fmt
        again = service.client.get(f"/v1/jobs/{job['id']}/adapter", params={"format": fmt})
        assert again.content == response.content, fmt  # the same bytes, download after download
        digests.add(digest)
    assert len(digests) == 3  # one digest per format


def check_predicted_beside_measured(service, job: dict, metrics: list[dict], cache: Path
                                    ) -> None:
    """Every step carries the plan's prediction beside its measurement; the job reports the
    measured step time beside the predicted one; and the measurement corrects this host's
    next plan for the same query (its calibrations are in ``cache``)."""
    plan, progress = job["plan"], job["progress"]
    for m in metrics:
        assert m["data"]["predicted_step_time_s"] == plan["predicted_step_time_s"] > 0
        assert m["data"]["predicted_peak_mb"] == plan["predicted_peak_mb"] > 0
    assert progress["predicted_step_time_s"] == plan["predicted_step_time_s"]
    assert progress["predicted_peak_mb"] == plan["predicted_peak_mb"]
    later = sorted(m["data"]["step_time_s"] for m in metrics[1:])  # after the first step
    assert progress["step_time_s"] == pytest.approx(statistics.median(later))

    events = service.job_events(job["id"])
    corrected = [e["data"] for e in events if "time_correction" in e["data"]]
    assert len(corrected) == 1, events
    assert corrected[0]["measured_step_time_s"] == pytest.approx(progress["step_time_s"])
    correction = corrected[0]["time_correction"]
    dtype = plan["matmul_dtype"]
    assert correction["matmul_dtype"] == dtype and correction["runs"] >= 1
    # the same query, planned again on this host at the threads the job ran (its worker's
    # next plan): the configuration the job ran is now predicted at its modelled time, each
    # part times the host's factor for it
    ran = TrainConfig.model_validate(job["config"])
    again = plan_on_host(load_architecture(SMALL_JOB["model"]), TrainConfig(
        seq_len=SMALL_JOB["hyperparameters"]["seq_len"],
        knobs=EngineKnobs(threads=ran.knobs.threads)), cache_dir=cache, measure=False)
    assert again.calibration["time_correction"][dtype] == correction
    rerun = next(e for e in again.entries if e.id == plan["configuration"])
    factors = corrected[0]["part_factors"]  # for this configuration, from the runs like it
    expected = sum(seconds * factors.get(part, correction["factor"])
                   for part, seconds in plan["modelled_time_s"].items())
    assert rerun.prediction.step_time_s == pytest.approx(expected, rel=2e-3, abs=1e-4)
    if correction["runs"] == 1:  # the first run on this calibration: its own ratio
        assert correction["factor"] == pytest.approx(
            progress["step_time_s"] / plan["modelled_step_time_s"], rel=1e-3)


def test_a_budget_too_small_is_refused_then_killed_by_the_kernel_cap(any_service):
    service = any_service
    dataset_id = upload_rows(service)
    status, refused = service.request("POST", "/v1/jobs",
                                      {**OVER_BUDGET_JOB, "training_file": dataset_id})
    assert status == 422
    error = refused["detail"][0]
    assert error["loc"] == ["body", "memory_budget_mb"]
    assert error["smallest_budget_mb"] > 300 and str(error["smallest_budget_mb"]) in error["msg"]

    job = submit(service, {**OVER_BUDGET_JOB, "allow_infeasible": True}, dataset_id)
    job = service.finished(job["id"])
    assert job["status"] == "failed", job
    assert job["error"]["code"] == "memory_budget_exceeded"
    detail = job["error"]["detail"]
    assert detail["cap_mb"] == 300 and detail["peak_mb"] >= 0.9 * 300
    assert detail["suggested_budget_mb"] == error["smallest_budget_mb"]
    assert "300 MB" in job["error"]["message"] and job["adapter"] is None

    # the worker keeps serving
    after = service.finished(submit(service, SMALL_JOB, dataset_id)["id"])
    assert after["status"] == "succeeded", after


def test_cancel_stops_a_running_job_keeping_its_adapter_and_drops_a_queued_one(any_service,
                                                                              cancel_at_end):
    service = any_service
    dataset_id = upload_rows(service)
    long_job = {**SMALL_JOB, "hyperparameters": {"steps": 100_000, "seq_len": 64}}
    running = submit(service, long_job, dataset_id)
    cancel_at_end(service, running["id"])
    queued = submit(service, long_job, dataset_id)  # behind it: one worker
    cancel_at_end(service, queued["id"])
    service.wait_for(running["id"], lambda job: job["progress"]["step"] >= 2)

    status, cancelled = service.request("POST", f"/v1/jobs/{queued['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled"
    status, _ = service.request("POST", f"/v1/jobs/{running['id']}/cancel")
    assert status == 200
    job = service.finished(running["id"], timeout_s=20)
    assert job["status"] == "cancelled" and job["error"] is None
    assert 2 <= job["progress"]["step"] < 100_000 and job["adapter"] is not None
    assert service.client.get(f"/v1/jobs/{running['id']}/adapter").status_code == 200
    assert service.request("POST", f"/v1/jobs/{running['id']}/cancel")[0] == 409
    never_ran = service.request("GET", f"/v1/jobs/{queued['id']}")[1]
    assert never_ran["status"] == "cancelled" and never_ran["started_at"] is None


def test_without_a_cgroup_an_rlimit_caps_the_job_and_every_job_says_so(rlimit_service):
    service = rlimit_service
    dataset_id = upload_rows(service)
    fits = service.finished(submit(service, SMALL_JOB, dataset_id)["id"])
    assert fits["status"] == "succeeded" and fits["enforcement"] == "rlimit"
    over = service.finished(submit(service, {**OVER_BUDGET_JOB, "allow_infeasible": True},
                                   dataset_id)["id"])
    assert over["status"] == "failed" and over["enforcement"] == "rlimit"
    assert over["error"]["code"] == "memory_budget_exceeded"
    assert "300 MB (rlimit)" in over["error"]["message"]
    assert over["error"]["detail"]["peak_mb"] > 100


def test_packing_a_model_for_a_job_is_reported_as_it_goes(service):
    """A model not packed yet (this group size is used by no other test) is packed before the
    job runs, and the event stream says how many tensors are done."""
    dataset_id = upload_rows(service)
    status, job = service.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": dataset_id, "device": "pixel-8",
        "hyperparameters": {"steps": 1, "seq_len": 16, "group_size": 16}})
    assert status == 201, job
    assert service.finished(job["id"])["status"] == "succeeded"
    events = service.job_events(job["id"])
    packing = [e["data"]["packing"] for e in events if "packing" in e["data"]]
    assert packing, events
    assert packing[-1]["tensors_done"] == packing[-1]["tensors_total"] > 1
    done = [p["tensors_done"] for p in packing]
    assert done == sorted(done)
