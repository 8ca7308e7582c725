"""The adapters a job keeps at its checkpoint steps (issue 33, item 2), against `mebp serve`
with workers this module starts (and kills): listed newest first with their step's losses,
each downloaded in every format the final adapter has and equal, tensor for tensor, to what a
run stopped at that step writes; the oldest dropped beyond MEBP_MAX_CHECKPOINTS_PER_JOB; a
job resumed after its worker was killed keeping the earlier ones, every step's once; another
tenant's a 404."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from held_engines import hold_engine, release, steps_written, storage_of
from service_harness import (
    FAST_RECOVERY,
    create_key,
    kill_group,
    start_service,
    start_worker,
    stop_service,
    tiny_job,
)
from waiting import poll_until

from mebp_core.engine.kept_adapters import kept_adapter_dir
from service.job_checkpoints import checkpoint_id
from service.storage import adapter_downloads_dir
from worker.child import ADAPTER, KEPT
from worker.engine_files import RESULT

MAX_CHECKPOINTS = 8
ROWS = b"".join(json.dumps({"text": f"checkpoint row {i} of the kept adapters"}).encode()
                + b"\n" for i in range(16))
HELD_OUT = b"".join(json.dumps({"text": f"held out row {i}"}).encode() + b"\n"
                    for i in range(4))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, model_cache):
    """`mebp serve` without workers of its own, and ``new_worker()``, which starts one."""
    root = tmp_path_factory.mktemp("checkpoints")
    env = {**FAST_RECOVERY, "MEBP_MAX_CHECKPOINTS_PER_JOB": str(MAX_CHECKPOINTS)}
    service = start_service(root, model_cache, env, workers=0)
    workers = []

    def new_worker(**extra_env: str):
        workers.append(start_worker(root / "data", model_cache, {
            **env, **extra_env, "REDIS_URL": f"unix://{root / 'data' / 'redis.socket'}"}))
        return workers[-1]
    yield service, new_worker, root / "data" / "storage", workers
    for worker in workers:
        if worker.poll() is None:
            kill_group(worker)
    stop_service(service)


@pytest.fixture(scope="module")
def service(deployment):
    service, new_worker, _, _ = deployment
    new_worker()
    return service


@pytest.fixture(scope="module")
def datasets(service):
    return (service.upload("rows.jsonl", ROWS)[1]["id"],
            service.upload("held-out.jsonl", HELD_OUT)[1]["id"])


def checkpoints(service, job_id: str, **params) -> dict:
    response = service.client.get(f"/v1/jobs/{job_id}/checkpoints", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def run_job(service, datasets, steps: int, **hyperparameters) -> dict:
    training, validation = datasets
    status, job = service.request("POST", "/v1/jobs", {
        **tiny_job(training, steps, **hyperparameters), "validation_file": validation})
    assert status == 201, job
    done = service.finished(job["id"])
    assert done["status"] == "succeeded", done
    return done


def test_a_job_keeps_its_adapter_every_checkpoint_step_with_that_steps_losses(service,
                                                                               datasets):
    job = run_job(service, datasets, 6, checkpoint_every=2, eval_every=3)
    listed = checkpoints(service, job["id"])
    assert [c["step"] for c in listed["data"]] == [6, 4, 2] and not listed["has_more"]
    metrics = {m["step"]: m for m in service.request(
        "GET", f"/v1/jobs/{job['id']}/metrics")[1]["data"]}
    for checkpoint in listed["data"]:
        metric = metrics[checkpoint["step"]]
        assert checkpoint["train_loss"] == metric["loss"]
        # validated at steps 3 and 6 (eval_every, and the last): 2 and 4 have none
        assert checkpoint["valid_loss"] == metric["data"].get("val_loss")
        assert checkpoint["job_id"] == job["id"]
    assert listed["data"][0]["valid_loss"] is not None
    assert [c["valid_loss"] for c in listed["data"][1:]] == [None, None]
    # each kept on the way has its event, with the sha256 webhooks forward (the last, step
    # 6, is the final adapter: the job's end announces it)
    events = [e["data"] for e in service.job_events(job["id"]) if e["kind"] == "checkpoint"]
    assert events == [{"step": c["step"], "loss": c["train_loss"], "valid_loss":
                       c["valid_loss"], "checkpoint_id": c["id"], "sha256": c["sha256"]}
                      for c in listed["data"][:0:-1]]

    # OpenAI's face: the same checkpoints, newest first, paged by id
    openai = service.request("GET", f"/v1/fine_tuning/jobs/{job['id']}/checkpoints")[1]
    assert [(c["id"], c["fine_tuned_model_checkpoint"], c["step_number"],
             c["metrics"]["step"], c["metrics"]["train_loss"], c["metrics"]["valid_loss"])
            for c in openai["data"]] == [
        (c["id"], c["id"], c["step"], c["step"], c["train_loss"], c["valid_loss"])
        for c in listed["data"]]
    first = service.request("GET", f"/v1/fine_tuning/jobs/{job['id']}/checkpoints?limit=1")[1]
    assert [c["step_number"] for c in first["data"]] == [6] and first["has_more"]
    rest = checkpoints(service, job["id"], after=listed["data"][0]["id"], limit=1)
    assert [c["step"] for c in rest["data"]] == [4] and rest["has_more"]


def test_a_checkpoints_adapter_is_what_a_run_stopped_at_its_step_trained(service, datasets):
    job = run_job(service, datasets, 6, checkpoint_every=2)
    stopped = run_job(service, datasets, 4, checkpoint_every=2)
    by_step = {c["step"]: c for c in checkpoints(service, job["id"])["data"]}
    at_4 = service.adapter_tensors(by_step[4]["downloads"]["peft"])
    alone = service.adapter_tensors(f"/v1/jobs/{stopped['id']}/adapter")
    assert at_4.keys() == alone.keys() and len(alone) > 0
    assert all(torch.equal(at_4[key], alone[key]) for key in alone)
    final = service.adapter_tensors(f"/v1/jobs/{job['id']}/adapter")
    at_6 = service.adapter_tensors(by_step[6]["downloads"]["peft"])
    assert all(torch.equal(at_6[key], final[key]) for key in final)
    assert not all(torch.equal(at_4[key], final[key]) for key in final)

    for fmt, url in by_step[4]["downloads"].items():  # every format the adapter has
        response = service.client.get(url)
        assert response.status_code == 200, (fmt, response.text)
        sha256 = response.headers["x-adapter-sha256"]
        assert sha256 == hashlib.sha256(response.content).hexdigest()
        if fmt == "peft":
            assert sha256 == by_step[4]["sha256"]
        assert by_step[4]["id"] in response.headers["content-disposition"]
    url = by_step[4]["downloads"]["peft"].split("?")[0]
    refused = service.client.get(url, params={"format": "onnx"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["query", "format"]
    missing = service.client.get(f"/v1/jobs/{job['id']}/checkpoints/"
                                 f"{by_step[4]['id']}x/adapter")
    assert missing.status_code == 404


def test_the_oldest_checkpoints_go_beyond_the_limit(service, datasets, deployment):
    steps = MAX_CHECKPOINTS + 3
    job = run_job(service, datasets, steps, checkpoint_every=1)
    listed = checkpoints(service, job["id"], limit=100)["data"]
    assert [c["step"] for c in listed] == list(range(steps, 3, -1))
    kept = deployment[2] / "jobs" / job["id"] / KEPT
    assert sorted(path.name for path in kept.iterdir()) == sorted(  # the last: its adapter
        [f"step-{step}" for step in range(4, steps)]
        + [f"step-{step}-downloads" for step in range(4, steps)])
    # a cursor pruned since it was read still pages on: to the older ones, also pruned
    for face in ("/v1/jobs", "/v1/fine_tuning/jobs"):
        page = service.client.get(f"{face}/{job['id']}/checkpoints",
                                  params={"after": checkpoint_id(job["id"], 2)})
        assert page.status_code == 200 and page.json()["data"] == [], page.text
        assert not page.json()["has_more"]
        for foreign in (checkpoint_id("job-other", 5), f"{listed[0]['id']}x", "ckpt-"):
            refused = service.client.get(f"{face}/{job['id']}/checkpoints",
                                         params={"after": foreign})
            assert refused.status_code == 422, (foreign, refused.text)


def test_a_job_resumed_after_its_worker_was_killed_keeps_its_earlier_checkpoints(
        deployment, service, datasets):
    _, new_worker, _, workers = deployment
    training, _ = datasets
    status, job = service.request("POST", "/v1/jobs", tiny_job(training, 40,
                                                                checkpoint_every=5))
    assert status == 201, job
    engine = hold_engine(storage_of(service), job["id"], 12)  # killed mid-job, not after
    service.wait_for(job["id"], lambda j: j["progress"]["step"] >= 12)
    # a step's kept adapters are recorded just after its progress, in their own write
    before = poll_until(lambda: checkpoints(service, job["id"])["data"],
                        lambda listed: {5, 10} <= {c["step"] for c in listed}, timeout_s=60,
                        failure=lambda listed: f"steps 5 and 10 never listed: {listed}")
    for worker in workers:  # the worker and the horse; the engine dies with its horse
        if worker.poll() is None:
            kill_group(worker)
    release(engine)
    new_worker()
    done = service.finished(job["id"])
    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    resumed = next(int(e["message"].rsplit(" ", 1)[1]) for e in service.job_events(job["id"])
                   if e["message"].startswith("resuming from the checkpoint at step"))
    after = checkpoints(service, job["id"])["data"]
    assert [c["step"] for c in after] == list(range(40, 0, -5))  # each once
    assert [c["id"] for c in after] == [checkpoint_id(job["id"], s) for s in range(40, 0, -5)]
    kept_before = [c for c in before if c["step"] <= resumed]
    assert kept_before, (before, resumed)  # those listed before the kill: untouched
    listed = {c["id"]: c for c in after}
    assert [listed[c["id"]] for c in kept_before] == kept_before
    metrics = {m["step"]: m["loss"] for m in service.request(
        "GET", f"/v1/jobs/{job['id']}/metrics")[1]["data"]}
    assert sorted(metrics) == list(range(1, 41))
    assert all(c["train_loss"] == metrics[c["step"]] for c in after)


def test_another_tenants_checkpoints_are_not_found(service, datasets):
    job = run_job(service, datasets, 2, checkpoint_every=1)
    checkpoint = checkpoints(service, job["id"])["data"][0]
    other = create_key(service, "checkpoint-thief")
    for path in (f"/v1/jobs/{job['id']}/checkpoints",
                 f"/v1/fine_tuning/jobs/{job['id']}/checkpoints",
                 checkpoint["downloads"]["peft"], checkpoint["downloads"]["gguf"]):
        response = service.client.get(path, headers={"Authorization": f"Bearer {other}"})
        assert response.status_code == 404, (path, response.text)
    assert service.client.get(checkpoint["downloads"]["peft"]).status_code == 200


def test_the_final_adapter_is_the_jobs_last_checkpoint(service, datasets, deployment):
    """With the default checkpoint_every (25), a 3-step job keeps none on the way: its
    final adapter is its one checkpoint, the same bytes."""
    job = run_job(service, datasets, 3)
    listed = checkpoints(service, job["id"])["data"]
    assert [(c["id"], c["step"]) for c in listed] == [(checkpoint_id(job["id"], 3), 3)]
    final = listed[0]
    assert (final["sha256"], final["bytes"]) == (job["adapter"]["sha256"],
                                                 job["adapter"]["bytes"])
    metric = service.request("GET", f"/v1/jobs/{job['id']}/metrics")[1]["data"][-1]
    assert final["train_loss"] == metric["loss"]
    assert final["valid_loss"] == metric["data"]["val_loss"] is not None  # the last validates
    assert (service.client.get(final["downloads"]["peft"]).content
            == service.client.get(f"/v1/jobs/{job['id']}/adapter").content)
    openai = service.request("GET", f"/v1/fine_tuning/jobs/{job['id']}/checkpoints")[1]
    assert [(c["id"], c["step_number"], c["sha256"]) for c in openai["data"]] == [
        (final["id"], 3, final["sha256"])]
    # announced by the job's end (job.succeeded), not as a job.checkpoint of its own
    assert [e for e in service.job_events(job["id"]) if e["kind"] == "checkpoint"] == []
    assert not (deployment[2] / "jobs" / job["id"] / KEPT).exists()  # not kept twice


def test_a_cancelled_job_lists_the_adapter_it_kept(service, datasets):
    """As OpenAI lists a cancelled job's checkpoints made: its adapter so far is its last."""
    training, _ = datasets
    status, job = service.request("POST", "/v1/jobs", tiny_job(training, 400,
                                                                checkpoint_every=1000))
    assert status == 201, job
    engine = hold_engine(storage_of(service), job["id"], 5)
    assert service.request("POST", f"/v1/jobs/{job['id']}/cancel")[0] == 200
    release(engine)
    done = service.finished(job["id"])
    assert done["status"] == "cancelled" and done["adapter"] is not None, done
    listed = checkpoints(service, job["id"])["data"]
    assert [(c["id"], c["sha256"]) for c in listed] == [
        (checkpoint_id(job["id"], done["progress"]["step"]), done["adapter"]["sha256"])]
    assert 5 <= listed[0]["step"] < 400


def test_a_checkpoint_pruned_as_it_is_asked_for_is_a_404_in_every_format(
        service, datasets, deployment):
    """The worker prunes a checkpoint after a download read its row: every format is a 404
    naming it (never a 200 of an empty zip, nor a 500), and no downloads folder is left."""
    job = run_job(service, datasets, 4, checkpoint_every=2)
    by_step = {c["step"]: c for c in checkpoints(service, job["id"])["data"]}
    kept = deployment[2] / "jobs" / job["id"] / KEPT
    for folder in (kept_adapter_dir(kept, 2), adapter_downloads_dir(kept_adapter_dir(kept, 2))):
        shutil.rmtree(folder)  # its files, as the worker removes them; its row stays
    for fmt, url in by_step[2]["downloads"].items():
        response = service.client.get(url)
        assert response.status_code == 404, (fmt, response.status_code, len(response.content))
        assert f"checkpoint {by_step[2]['id']} " in response.json()["detail"], response.text
        assert "pruned" in response.json()["detail"]
    assert list(kept.iterdir()) == []
    for url in by_step[4]["downloads"].values():  # the final: never pruned
        assert service.client.get(url).status_code == 200, url


def test_a_checkpoint_that_cannot_be_recorded_ends_the_job_and_its_engine(
        deployment, service, datasets):
    """Its zip cannot be made (here: a file where its downloads folder goes; a full disk
    alike): the job fails and its engine is killed, even under an rlimit cap, which no
    cgroup's removal would stop."""
    _, new_worker, storage, workers = deployment
    for worker in workers:
        if worker.poll() is None:
            kill_group(worker)
    new_worker(MEBP_ENFORCEMENT="rlimit")
    training, _ = datasets
    steps = 3000
    status, job = service.request("POST", "/v1/jobs", tiny_job(training, steps,
                                                                checkpoint_every=100))
    assert status == 201, job
    engine = hold_engine(storage, job["id"], 1)
    folder = storage / "jobs" / job["id"]
    (folder / KEPT).mkdir(exist_ok=True)
    adapter_downloads_dir(kept_adapter_dir(folder / KEPT, 100)).write_text("no folder")
    release(engine)
    done = service.finished(job["id"])
    assert done["status"] == "failed" and done["error"]["code"] == "worker_error", done
    assert done["enforcement"] == "rlimit"
    engine.wait(timeout=120)  # killed, not left training
    assert not (folder / RESULT).exists() and not (folder / ADAPTER).exists()
    assert steps_written(folder) < steps
