"""The OpenAI-compatible surface, driven by the official ``openai`` package against the real
service: files are datasets, fine-tuning jobs are jobs (mebp's own fields in
``extra_body``), refusals arrive as the SDK's own exceptions."""

from __future__ import annotations

import openai
import pytest
from service_harness import HANG_GUARD_S, TERMINAL, create_key, poll_until

ROWS = b"".join(b'{"text": "the sdk trains on row %d of its file"}\n' % i for i in range(8))
TINY = {"device": "pixel-8", "hyperparameters": {"steps": 3, "seq_len": 32}}


def sdk(service, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.url}/v1", api_key=key or service.api_key,
                         max_retries=0)


@pytest.fixture(scope="module")
def client(service):
    with sdk(service) as client:
        yield client


@pytest.fixture(scope="module")
def training_file(client):
    return client.files.create(file=("train.jsonl", ROWS), purpose="fine-tune")


def test_an_upload_is_a_file_and_the_same_dataset(service, client, training_file):
    assert (training_file.object, training_file.purpose, training_file.status) == (
        "file", "fine-tune", "processed")
    assert (training_file.filename, training_file.bytes) == ("train.jsonl", len(ROWS))
    assert client.files.retrieve(training_file.id).created_at == training_file.created_at
    assert training_file.id in [file.id for file in client.files.list()]
    status, dataset = service.request("GET", f"/v1/datasets/{training_file.id}")
    assert status == 200 and dataset["rows"] == 8


def test_the_sdk_fine_tunes_follows_and_lists_checkpoints(service, client, training_file,
                                                           cancel_at_end):
    job = client.fine_tuning.jobs.create(model="preset:tiny", training_file=training_file.id,
                                         method={"type": "supervised"}, extra_body=TINY)
    cancel_at_end(service, job.id)
    assert (job.object, job.organization_id) == ("fine_tuning.job", "default")
    assert job.status in ("queued", "running")  # a worker may claim it at once
    assert job.hyperparameters.steps == 3 and job.device == "pixel-8"

    def events():
        return client.fine_tuning.jobs.list_events(job.id, limit=100).data
    ended = poll_until(events, lambda page: any(
        event.data.get("status") in TERMINAL for event in page), HANG_GUARD_S,
        lambda page: f"not done: {page}")
    assert "succeeded" in [event.data.get("status") for event in ended], ended
    assert [event.id for event in ended] == sorted((e.id for e in ended), key=int, reverse=True)
    assert {event.object for event in ended} == {"fine_tuning.job.event"}

    done = client.fine_tuning.jobs.retrieve(job.id)
    assert done.status == "succeeded" and done.finished_at >= done.created_at
    assert done.fine_tuned_model.startswith("ad-") and done.error is None
    assert done.method.type == "supervised" and done.method.name == "mebp"
    # the default checkpoint_every (25) keeps none of 3 steps on the way: the final adapter
    # is the job's one checkpoint, as OpenAI lists a job's last
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id)
    assert [(c.step_number, c.metrics.step, c.fine_tuning_job_id)
            for c in checkpoints.data] == [(3, 3, job.id)] and not checkpoints.has_more
    final = checkpoints.data[0]
    assert final.object == "fine_tuning.job.checkpoint"
    assert final.fine_tuned_model_checkpoint == final.id
    metrics = service.request("GET", f"/v1/jobs/{job.id}/metrics")[1]["data"]
    assert final.metrics.train_loss == metrics[-1]["loss"] is not None
    assert final.metrics.valid_loss is None  # no validation file
    assert [c.id for c in client.fine_tuning.jobs.checkpoints.list(
        job.id, limit=1, after=final.id).data] == []
    response = service.client.get(f"/v1/jobs/{job.id}/checkpoints/{final.id}/adapter")
    assert response.headers["x-adapter-sha256"] == final.sha256
    assert response.content == service.client.get(f"/v1/jobs/{job.id}/adapter").content
    status, mebp_job = service.request("GET", f"/v1/jobs/{job.id}")
    assert mebp_job["adapter"]["id"] == done.fine_tuned_model


def test_the_sdk_cancels_and_pages_jobs(service, client, training_file, cancel_at_end):
    first = client.fine_tuning.jobs.create(model="preset:tiny", training_file=training_file.id,
                                           extra_body=TINY)
    long = client.fine_tuning.jobs.create(
        model="preset:tiny", training_file=training_file.id, extra_body={
            "device": "pixel-8", "method": "mezo",
            "hyperparameters": {"steps": 100_000, "seq_len": 32}})
    cancel_at_end(service, first.id)
    cancel_at_end(service, long.id)
    assert long.method.name == "mezo"
    cancelling = client.fine_tuning.jobs.cancel(long.id)
    assert cancelling.status in ("cancelled", "queued", "running")
    assert service.finished(long.id)["status"] == "cancelled"
    assert client.fine_tuning.jobs.retrieve(long.id).status == "cancelled"
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.cancel(long.id)

    page = client.fine_tuning.jobs.list(limit=1)
    assert [job.id for job in page.data] == [long.id] and page.has_more
    after = client.fine_tuning.jobs.list(after=long.id, limit=1)
    assert [job.id for job in after.data] == [first.id]


def test_bad_input_is_the_sdks_error_and_keeps_nothing(service, client, training_file):
    def create(**extra):
        return client.fine_tuning.jobs.create(model="preset:tiny",
                                              training_file=training_file.id,
                                              extra_body={**TINY, **extra})
    for extra, param in (({"devise": "pixel-8"}, "devise"),
                         ({"memory_budget_mb": "lots"}, "memory_budget_mb"),
                         ({"hyperparameters": {"n_epochs": 3}}, "hyperparameters.n_epochs"),
                         ({"suffix": "mine"}, "suffix"),
                         ({"model": "preset:no-such-model"}, "model")):
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            create(**extra)
        assert refused.value.param == param, refused.value.body
        assert refused.value.type == "invalid_request_error"
    files_before = [file.id for file in client.files.list(limit=100)]
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.files.create(file=("x.jsonl", ROWS), purpose="assistants")
    assert refused.value.param == "purpose"
    assert [file.id for file in client.files.list(limit=100)] == files_before
    with pytest.raises(openai.UnprocessableEntityError) as refused:  # refused before routing
        client.files.list(extra_query={"after": "ds-\x00"})
    assert refused.value.param == "after"
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.retrieve("job-0000")
    with pytest.raises(openai.AuthenticationError):
        sdk(service, "not-a-key").files.list()


def test_another_tenants_files_and_jobs_are_refused(service, client, training_file):
    with sdk(service, create_key(service, "sdk-other")) as other:
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            other.fine_tuning.jobs.create(model="preset:tiny",
                                          training_file=training_file.id, extra_body=TINY)
        assert refused.value.param == "training_file"
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(training_file.id)
        with pytest.raises(openai.NotFoundError):
            other.files.delete(training_file.id)
        assert other.files.list().data == []
    assert client.files.retrieve(training_file.id).id == training_file.id


def test_a_file_is_deleted_once_nothing_uses_it(service, client, cancel_at_end):
    spare, used = (client.files.create(file=(name, ROWS), purpose="fine-tune")
                   for name in ("spare.jsonl", "used.jsonl"))
    assert client.files.delete(spare.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(spare.id)
    job = client.fine_tuning.jobs.create(model="preset:tiny", training_file=used.id,
                                         extra_body=TINY)
    cancel_at_end(service, job.id)
    with pytest.raises(openai.ConflictError) as refused:
        client.files.delete(used.id)
    assert job.id in refused.value.message
    assert client.files.retrieve(used.id).id == used.id


def test_models_are_openai_model_objects_with_mebps_fields(client):
    models = client.models.list().data
    tiny = next(model for model in models if model.id == "preset:tiny")
    assert (tiny.object, tiny.owned_by, tiny.created) == ("model", "mebp", 0)
    assert tiny.source == "preset" and tiny.parameters > 0
    assert client.models.retrieve("preset:tiny").model_type == tiny.model_type
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("preset:no-such-model")
