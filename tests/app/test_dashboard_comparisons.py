"""A comparison in a real browser against `mebp serve`: started from its form, followed live
to its end, its curves drawn in phone time and its failed jobs marked."""

from __future__ import annotations

import re

import pytest
from dashboard_harness import chart_traces, shoot, sign_in
from playwright.sync_api import expect
from test_api_comparisons import HELD_OUT, ROWS, comparison, comparison_when_done, upload


@pytest.fixture(scope="module")
def data(service) -> dict:
    return {"training_file": upload(service, "compare-train.jsonl", ROWS),
            "validation_file": upload(service, "compare-valid.jsonl", HELD_OUT)}


def test_start_a_comparison_from_its_form_and_watch_it_finish(page, service, data):
    sign_in(page, service.api_key)
    # what the explorer's button opens: its model, device and sequence length
    page.goto("/comparisons/new?model=preset:tiny&device=pixel-8&seq_len=32")
    expect(page.locator("input[name=seq_len]")).to_have_value("32")
    page.select_option("select[name=training_file]", data["training_file"])
    page.select_option("select[name=validation_file]", data["validation_file"])
    expect(page.locator("input[name=methods][value=mebp]")).to_be_checked()
    expect(page.locator("input[name=methods][value=mezo]")).to_be_checked()
    page.fill("input[name=learning_rates_mebp]", "0.05, 0.2")
    page.fill("input[name=learning_rates_mezo]", "0.001")
    page.fill("input[name=max_steps]", "4")
    page.fill("input[name=eval_every]", "2")
    shoot(page, "comparison-form")
    page.click("#comparison-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/comparisons/cmp-[0-9a-f]+$"))
    comparison_id = page.url.rsplit("/", 1)[1]
    # the page polls: it reaches done by itself, no reload
    expect(page.locator("#comparison-status")).to_have_text("done", timeout=300_000)
    done = service.request("GET", f"/v1/comparisons/{comparison_id}")[1]
    expect(page.locator("#comparison-summary")).to_have_text(done["summary"])
    assert "of phone time" in done["summary"]

    traces = {trace["name"]: trace for trace in chart_traces(page, "curve-chart")}
    for method, name in (("mebp", "MeBP"), ("mezo", "MeZO")):
        outcome = next(m for m in done["methods"] if m["method"] == method)
        best = traces[f"{name} (best: lr {outcome['best_learning_rate']:g})"]
        assert best["x"] == [p["device_time_s"] for p in outcome["best_curve"]]
        assert best["y"] == [p["val_loss"] for p in outcome["best_curve"]]
    faint = [name for name in traces if name.startswith("MeBP lr ")]
    assert len(faint) == 1, traces.keys()  # the other learning rate, drawn faint
    title = page.evaluate("document.getElementById('curve-chart').layout.xaxis.title.text")
    assert title == "time on pixel-8 (estimated seconds)"
    measured = next(t for t in chart_traces(page, "memory-chart") if t["name"] == "measured")
    assert measured["y"] == [m["measured_peak_mb"] for m in done["methods"]]
    expect(page.locator("#run-table tbody tr")).to_have_count(3)
    expect(page.locator("#run-table tbody tr.best")).to_have_count(2)
    shoot(page, "comparison")


def test_failed_jobs_are_marked_on_the_page(page, service, data):
    status, made = service.request("POST", "/v1/comparisons", comparison(
        data, max_steps=3, methods=["mebp"], learning_rates={"mebp": [0.01]},
        memory_budget_mb=64, allow_infeasible=True))
    assert status == 201, made
    comparison_when_done(service, made["id"])
    sign_in(page, service.api_key)
    page.goto(f"/comparisons/{made['id']}")
    failed = page.locator("#run-table tbody tr.failed")
    expect(failed).to_have_count(1)
    expect(failed.locator(".badge")).to_have_text("failed")
    expect(failed.locator(".code")).to_have_text("memory_budget_exceeded")
    expect(page.locator("#comparison-summary")).to_contain_text(
        "every MeBP run failed (memory_budget_exceeded)")
    shoot(page, "comparison-failed")
