"""The job page's base downloads in a real browser: the float32 exports and those a phone
can hold (GGUF q4_1 and q8_0, MLX 4-bit), each with its size, predicted from the model's
shapes until a worker has made it, then the made file's, which the link downloads."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dashboard_harness import shoot, sign_in
from playwright.sync_api import expect
from service_harness import tiny_job

from mebp_core.units import MB

ROWS = b"".join(json.dumps({"text": f"a base for phone {i}"}).encode() + b"\n"
                for i in range(16))
LABELS = ["hf", "gguf", "gguf q4_1", "gguf q8_0", "mlx"]


def sizes(service) -> dict[tuple[str, str], dict]:
    status, listed = service.request("GET", "/v1/models/preset:tiny/base/formats")
    assert status == 200, listed
    return {(e["format"], e["quant"]): e for e in listed["data"] if e["dtype"] == "float32"}


def test_the_job_page_shows_each_bases_size_predicted_then_made(page, service):
    status, dataset = service.upload("phone.jsonl", ROWS)
    assert status == 201, dataset
    status, job = service.request("POST", "/v1/jobs", tiny_job(dataset["id"], 2))
    assert status == 201, job
    assert service.finished(job["id"])["status"] == "succeeded"
    sign_in(page, service.api_key)
    page.goto(f"/jobs/{job['id']}")
    links = page.locator("#base-downloads a")
    expect(links).to_have_text(LABELS)
    listed = sizes(service)
    q4_1, f32 = listed["gguf", "q4_1"], listed["gguf", "int4"]
    texts = page.locator("#base-downloads .base-size").all_text_contents()
    for text, (fmt, quant) in zip(texts, [("hf", "int4"), ("gguf", "int4"), ("gguf", "q4_1"),
                                          ("gguf", "q8_0"), ("mlx", "int4")], strict=True):
        entry = listed[fmt, quant]
        if entry["bytes"] is None:  # another test may have made the float32 ones
            assert text == f"~{entry['predicted_bytes'] / MB:.1f} MB predicted"
        else:
            assert text == f"{entry['bytes'] / MB:.1f} MB"
    assert q4_1["predicted_bytes"] * 6 < f32["predicted_bytes"]
    shoot(page, "job-base-sizes")

    made = service.base("preset:tiny", format="gguf", quant="q4_1")  # a worker makes it
    assert made.status_code == 200 and made.content[:4] == b"GGUF"
    page.reload()
    q4_1_size = page.locator("#base-downloads .base-size").nth(LABELS.index("gguf q4_1"))
    expect(q4_1_size).to_have_text(f"{len(made.content) / MB:.1f} MB")
    with page.expect_download() as download:
        page.click("#base-downloads a[data-quant=q4_1]")
    assert Path(download.value.path()).read_bytes() == made.content
    assert sizes(service)["gguf", "q4_1"]["bytes"] == len(made.content)
    # an export not made yet: its page offers to start it, and says what it holds
    page.goto(f"/jobs/{job['id']}")
    page.click("#base-downloads a[data-format=mlx]")
    expect(page).to_have_url(re.compile(r"/base\?format=mlx$"))
    expect(page.locator(".summary")).to_contain_text("MLX quantized weights")
