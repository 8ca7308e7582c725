"""From a job to a running adapter, as a user downloads it: the PEFT adapter loads onto the
base the service exports by the name it carries, and llama.cpp itself runs the GGUF base with
the GGUF adapter to PEFT's logits. Every download's digest is of the exact bytes served."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import numpy as np
import torch
from built_by_make import import_built
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer

llama_cpp = import_built("llama_cpp", "llama-cpp")

ROWS = b"".join(json.dumps({"text": f"the quick brown fox {i} jumps over the lazy dog"})
                .encode() + b"\n" for i in range(32))
JOB = {"model": "preset:tiny", "memory_budget_mb": 1024,
       "hyperparameters": {"steps": 4, "seq_len": 64, "learning_rate": 0.5}}
PROMPT = "the quick brown fox"
TOLERANCE = 1e-4  # float32 weights and KV cache; llama.cpp sums in its own order
F32 = llama_cpp.GGML_TYPE_F32


def download(service, path: str, **params) -> bytes:
    response = service.base("preset:tiny", **params) if path.endswith("/base") \
        else service.client.get(path, params=params)
    assert response.status_code == 200, response.text
    digest = response.headers.get("x-base-sha256") or response.headers["x-adapter-sha256"]
    assert digest == hashlib.sha256(response.content).hexdigest(), path
    return response.content


def test_a_jobs_adapter_runs_in_peft_and_in_llama_cpp_as_downloaded(service, tmp_path,
                                                                     monkeypatch):
    dataset = service.upload("train.jsonl", ROWS)[1]["id"]
    status, job = service.request("POST", "/v1/jobs", {**JOB, "training_file": dataset})
    assert status == 201, job
    assert service.finished(job["id"], timeout_s=300)["status"] == "succeeded"

    adapter_zip = download(service, f"/v1/jobs/{job['id']}/adapter")
    zipfile.ZipFile(io.BytesIO(adapter_zip)).extractall(tmp_path / "adapter")
    base_name = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())[
        "base_model_name_or_path"]
    base_zip = download(service, "/v1/models/preset:tiny/base", format="hf")
    archive = zipfile.ZipFile(io.BytesIO(base_zip))
    assert {name.split("/")[0] for name in archive.namelist()} == {base_name}
    archive.extractall(tmp_path)
    assert download(service, "/v1/models/preset:tiny/base", format="hf") == base_zip  # kept

    monkeypatch.chdir(tmp_path)  # the adapter finds its base by name, as downloaded
    model = AutoPeftModelForCausalLM.from_pretrained("adapter")
    ids = AutoTokenizer.from_pretrained(base_name).encode(PROMPT, add_special_tokens=False)
    assert ids == list(PROMPT.encode())
    with torch.no_grad():
        adapted = model(input_ids=torch.tensor([ids])).logits[0].numpy()
        with model.disable_adapter():
            base = model(input_ids=torch.tensor([ids])).logits[0].numpy()

    (tmp_path / "base.gguf").write_bytes(
        download(service, "/v1/models/preset:tiny/base", format="gguf"))
    (tmp_path / "adapter.gguf").write_bytes(
        download(service, f"/v1/jobs/{job['id']}/adapter", format="gguf"))
    runtime = llama_cpp.Llama(model_path="base.gguf", lora_path="adapter.gguf", n_ctx=64,
                              logits_all=True, n_threads=1, verbose=False,
                              type_k=F32, type_v=F32)
    try:
        assert runtime.tokenize(PROMPT.encode(), add_bos=False, special=False) == ids
        runtime.eval(ids)
        theirs = np.array(runtime.scores[:len(ids)])
    finally:
        runtime.close()
    scale = np.abs(adapted).max()
    assert np.abs(theirs - adapted).max() <= TOLERANCE * scale
    assert np.abs(adapted - base).max() > 100 * TOLERANCE * scale  # the adapter matters


def test_a_base_is_exported_once_in_the_background_and_then_served(service):
    first = service.client.get("/v1/models/preset:tiny/base", params={"dtype": "float16"})
    assert first.status_code == 202 and first.json()["status"] == "exporting"
    assert first.headers["retry-after"] == "5"
    served = service.base("preset:tiny", dtype="float16")
    assert served.status_code == 200
    assert served.headers["x-base-sha256"] == hashlib.sha256(served.content).hexdigest()
    again = service.client.get("/v1/models/preset:tiny/base", params={"dtype": "float16"})
    assert again.status_code == 200 and again.content == served.content  # kept


def test_a_base_that_cannot_be_served_is_refused_with_its_reason(service):
    response = service.client.get("/v1/models/no-such-model/base")
    assert response.status_code == 404 and "no-such-model" in response.json()["detail"]
    response = service.client.get("/v1/models/preset:gemma3-1b/base",
                                  params={"format": "gguf"})
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["query", "format"] and "convert_hf_to_gguf" in error["msg"]
    response = service.client.get("/v1/models/preset:tiny/base", params={"dtype": "int3"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "dtype"]
