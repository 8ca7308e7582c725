"""A job's page lists the checkpoints it keeps, in a real browser against `mebp serve`:
newest first with their step's losses, as they are kept while the page is open, each
downloadable in the adapter's formats with the page's cookie alone."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from dashboard_harness import shoot, sign_in
from playwright.sync_api import expect
from service_harness import tiny_job
from test_dashboard import ROWS

STEPS, EVERY = 6, 2


def test_a_job_page_lists_its_checkpoints_with_their_downloads(page, service):
    dataset = service.upload("checkpoints.jsonl", ROWS)[1]["id"]
    status, job = service.request("POST", "/v1/jobs", tiny_job(dataset, STEPS,
                                                               checkpoint_every=EVERY))
    assert status == 201, job
    sign_in(page, service.api_key)
    page.goto(f"/jobs/{job['id']}")  # opened while it is queued or training
    rows = page.locator("#checkpoints tbody tr")
    expect(rows).to_have_count(STEPS // EVERY, timeout=120_000)
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=120_000)
    expect(page.locator("#checkpoints-none")).to_be_hidden()
    expect(page.locator("#checkpoints-more")).to_be_hidden()  # all on one page
    listed = service.request("GET", f"/v1/jobs/{job['id']}/checkpoints")[1]["data"]
    expect(rows.locator("td:first-child")).to_have_text(["6", "4", "2"])
    shown = rows.first.locator("td:nth-child(2)").text_content()
    assert float(shown) == pytest.approx(listed[0]["train_loss"], rel=1e-3)
    expect(rows.first.locator("a")).to_have_text(["peft", "mlx", "gguf"])
    shoot(page, "job-checkpoints")

    with page.expect_download() as download:
        rows.nth(1).locator("a:has-text('peft')").click()
    archive = zipfile.ZipFile(io.BytesIO(Path(download.value.path()).read_bytes()))
    assert "adapter_model.safetensors" in archive.namelist()
    assert download.value.suggested_filename == f"{listed[1]['id']}-peft.zip"

    page.reload()  # listed from the page's own data too, not only as they are kept
    expect(rows.locator("td:first-child")).to_have_text(["6", "4", "2"])
