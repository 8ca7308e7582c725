"""The service's own processes run without torch: `mebp serve` (the API) and its workers
plan, queue, stream and serve with the planner and the service core, which are torch-free;
torch lives in the engines (forked from each worker's zygote). Torch costs a process about
150 MB and a second of imports, so a service at rest holds it once per engine, not once per
process. It loads in the API only for a first MLX or GGUF adapter export, and in a worker
where it packs a model, exports a base or combines a fleet's round."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import psutil
from process_trees import process_tree
from service_harness import API_KEY, start_service, stop_service, tiny_job

from app.sessions import SESSION_COOKIE

ROWS = b"".join(json.dumps({"text": f"footprint row {i}"}).encode() + b"\n" for i in range(8))


def maps_torch(process: psutil.Process) -> bool:
    return "libtorch_cpu" in Path(f"/proc/{process.pid}/maps").read_text()


def test_the_api_and_its_workers_never_load_torch_through_a_job_its_pages_and_downloads(
        tmp_path, model_cache):
    service = start_service(tmp_path, model_cache, {})
    try:
        dataset = service.upload("rows.jsonl", ROWS)[1]["id"]
        job = service.request("POST", "/v1/jobs", tiny_job(dataset, 3))[1]
        assert service.finished(job["id"])["status"] == "succeeded"
        assert service.adapter_tensors(f"/v1/jobs/{job['id']}/adapter")  # the PEFT zip
        # the job's page lists its base's exports with their sizes, and so does the model's
        # formats listing; a base asked for is checked against GGUF's and MLX's rules
        with httpx.Client(base_url=service.url, timeout=60) as browser:
            signed_in = browser.post("/signin", data={"api_key": API_KEY},
                                     headers={"Origin": service.url})
            assert signed_in.status_code == 303 and SESSION_COOKIE in browser.cookies
            page = browser.get(f"/jobs/{job['id']}")
            assert page.status_code == 200 and "format=gguf" in page.text, page.text[-2000:]
        status, formats = service.request("GET", "/v1/models/preset:tiny/base/formats")
        assert status == 200 and {f["format"] for f in formats["data"]} >= {"gguf", "mlx"}
        for fmt, said in (("gguf", "GGUF bases are written as"), ("mlx", "MLX bases keep")):
            status, refused = service.request(
                "GET", f"/v1/models/preset:tiny/base?format={fmt}&dtype=bfloat16")
            assert status == 422 and said in json.dumps(refused), refused
        processes = process_tree(service.process.pid)
        engines = [p for p in processes if "engine_zygote" in " ".join(p.cmdline())]
        own = [p for p in processes if p not in engines and "redis" not in p.name()]
        workers = [p for p in own if "worker" in " ".join(p.cmdline())]
        assert engines and workers, [p.cmdline() for p in processes]
        assert all(maps_torch(p) for p in engines)  # the check sees torch where it is
        assert [p.cmdline() for p in own if maps_torch(p)] == []
    finally:
        stop_service(service)
