"""The quantized bases through the API, in process over the machine's Redis: every export a
model can be written in is listed with its size (predicted from its shapes, then the made
file's); ``format=mlx`` and ``quant=q4_1|q8_0`` are checked before anything is queued; an
export asked for is queued for the workers (RQ's exports queue) and never made in the API
process. A real RQ worker, run here on that queue, makes it and the API serves it."""

from __future__ import annotations

import io
import json
import shutil
import uuid
import zipfile

import pytest
from rq import Queue, SimpleWorker

from mebp_core.store.export_size import export_weight_bytes, source_specs
from service.base_export_queue import MAKE_BASE, exports_queue_name
from service.queue import connect
from service.storage import bases_dir
from worker.main import PolledCommands

BASE = "/v1/models/preset:tiny/base"
FORMATS = BASE + "/formats"
METADATA_BYTES = 64 * 1024  # config, byte tokenizer, GGUF header, zip entries: ~10 KB


def settings_of(api):
    return api.client.app.state.settings


def exports_queue(api) -> Queue:
    settings = settings_of(api)
    return Queue(exports_queue_name(settings.queue_name), connection=connect(settings.redis_url))


class InProcessWorker(PolledCommands, SimpleWorker):
    """RQ's worker that runs its jobs in this process, listening for commands as the
    service's workers do (RQ's own listener, stopped at the end, could take a minute)."""


def run_export_worker(api, monkeypatch) -> None:
    """RQ's own worker on the service's exports queue until it is empty, in this process
    (as ``mebp worker``'s horse runs the job: it reads its settings from the environment)."""
    settings = settings_of(api)
    for name, value in (("MEBP_DATA_DIR", settings.data_dir), ("MEBP_CACHE_DIR",
                        settings.cache_dir), ("MEBP_QUEUE_NAME", settings.queue_name),
                        ("REDIS_URL", settings.redis_url)):
        monkeypatch.setenv(name, str(value))
    queue = exports_queue(api)
    assert InProcessWorker([queue], connection=queue.connection).work(burst=True)


@pytest.mark.parametrize(("params", "field", "says"), [
    ({"format": "hf", "quant": "q4_1"}, "quant", "GGUF block type; format hf has none"),
    ({"format": "mlx", "quant": "q8_0"}, "quant", "format mlx has none"),
    ({"format": "gguf", "quant": "q4_0"}, "quant", "q4_1"),
    ({"format": "mlx", "quant": "none"}, "quant", "stored none has none"),
    ({"format": "mlx", "group_size": 256}, "group_size", "groups of (32, 64, 128)"),
    ({"format": "mlx", "dtype": "bfloat16"}, "dtype", "not bfloat16"),
    ({"format": "gguf", "dtype": "bfloat16"}, "dtype", "not bfloat16"),
    ({"format": "gguf", "quant": "q4_1", "group_size": 16}, "group_size", "multiple of 32"),
    ({"format": "gguf", "quant": "q8_0", "dtype": "float16"}, "dtype", "float32"),
    ({"format": "onnx"}, "format", "mlx")])
def test_export_parameters_are_refused_naming_the_parameter(api, params, field, says):
    response = api.client.get(BASE, params=params)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["query", field] and says in error["msg"], error
    assert not exports_queue(api).count  # nothing queued


def test_every_export_is_listed_with_its_predicted_size(api):
    response = api.client.get(FORMATS, params={"quant": "int4", "group_size": 64})
    assert response.status_code == 200, response.text
    listed = {(e["format"], e["quant"], e["dtype"]): e for e in response.json()["data"]}
    assert set(listed) == {
        ("hf", "int4", "float32"), ("hf", "int4", "float16"), ("hf", "int4", "bfloat16"),
        ("gguf", "int4", "float32"), ("gguf", "int4", "float16"),
        ("gguf", "q8_0", "float32"), ("gguf", "q4_1", "float32"),
        ("mlx", "int4", "float32"), ("mlx", "int4", "float16")}
    specs = source_specs("preset:tiny")
    for (fmt, quant, dtype), entry in listed.items():
        gguf_quant = quant if quant.startswith("q") else None
        assert entry["predicted_bytes"] == export_weight_bytes(
            specs, quant="int4", group_size=64, fmt=fmt, dtype=dtype, gguf_quant=gguf_quant)
        assert entry["exact"] == ((fmt, quant, dtype) in {
            ("hf", "int4", "float32"), ("gguf", "int4", "float32"),
            ("gguf", "q4_1", "float32"), ("mlx", "int4", "float32")})
    q4_1, f32 = listed["gguf", "q4_1", "float32"], listed["gguf", "int4", "float32"]
    assert q4_1["predicted_bytes"] < f32["predicted_bytes"] / 6  # a base a phone can hold
    # GGUF blocks are of the int4 store; an int8 one is 8-bit MLX, an unquantized one neither
    int8 = api.client.get(FORMATS, params={"quant": "int8"}).json()["data"]
    assert {(e["format"], e["quant"]) for e in int8} == {
        ("hf", "int8"), ("gguf", "int8"), ("mlx", "int8")}
    none = api.client.get(FORMATS, params={"quant": "none"}).json()["data"]
    assert {e["format"] for e in none} == {"hf", "gguf"}
    assert api.client.get(FORMATS, params={"quant": "q4_1"}).status_code == 422
    assert api.client.get("/v1/models/nope/base/formats").status_code == 404


@pytest.mark.parametrize(("params", "ending"), [
    ({"format": "mlx"}, "-mlx-float32.zip"), ({"format": "gguf", "quant": "q4_1"}, "-q4_1.gguf")])
def test_an_export_is_queued_for_a_worker_which_makes_it(api, monkeypatch, params, ending):
    settings = settings_of(api)
    queued = api.client.get(BASE, params=params)
    assert queued.status_code == 202 and int(queued.headers["retry-after"]) > 0
    assert "exported by a worker" in queued.json()["detail"]
    [job] = exports_queue(api).jobs
    assert job.func_name == MAKE_BASE
    again = api.client.get(BASE, params=params)  # joins it: nothing more queued
    assert again.status_code == 202 and exports_queue(api).count == 1
    assert not list(bases_dir(settings.storage_root).glob(f"*{ending}*"))  # the API made none
    listed = [e for e in api.client.get(FORMATS).json()["data"]
              if e["format"] == params["format"] and e["quant"] == params.get("quant", "int4")
              and e["dtype"] == "float32"]
    assert [e["status"] for e in listed] == ["queued"]  # no exports worker here

    run_export_worker(api, monkeypatch)
    made = api.client.get(BASE, params=params)
    assert made.status_code == 200, made.text
    [entry] = [e for e in api.client.get(FORMATS).json()["data"] if e["url"] == listed[0]["url"]]
    assert entry["status"] == "kept" and entry["bytes"] == len(made.content)
    assert entry["predicted_bytes"] <= entry["bytes"] <= entry["predicted_bytes"] + METADATA_BYTES
    if params["format"] == "mlx":
        names = zipfile.ZipFile(io.BytesIO(made.content)).namelist()
        top = names[0].split("/")[0]
        assert top.endswith("-mlx") and f"{top}/model.safetensors" in names
        config = json.loads(zipfile.ZipFile(io.BytesIO(made.content)).read(f"{top}/config.json"))
        assert config["quantization"]["bits"] == 4
    else:
        assert made.content[:4] == b"GGUF"


def test_a_failed_export_is_told_once_then_tried_again(api, monkeypatch, model_root):
    """A registered model whose weights were truncated after it was registered: its export
    fails on the worker (no retry: an error, not a death), the next ask is a 500 saying why,
    and the one after queues it again."""
    broken = model_root / f"broken-{uuid.uuid4().hex[:8]}"
    shutil.copytree(model_root / "tiny-hf", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    status, model = api.request("POST", "/v1/models", {"name": broken.name, "path": str(broken)})
    assert status == 201, model
    path = f"/v1/models/{broken.name}/base"
    assert api.client.get(path, params={"format": "mlx"}).status_code == 202
    run_export_worker(api, monkeypatch)
    failed = api.client.get(path, params={"format": "mlx"})
    assert failed.status_code == 500, failed.text
    assert "exporting the base failed" in failed.json()["detail"]
    assert "model.safetensors" in failed.json()["detail"]
    again = api.client.get(path, params={"format": "mlx"})
    assert again.status_code == 202 and exports_queue(api).count == 1
    exports_queue(api).empty()
