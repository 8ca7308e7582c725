"""The phone's time where the user watches (issue 33, item 4), in a real browser against
`mebp serve`: a job's page gives its phone's estimated time beside this host's and can draw
its loss against it; the explorer draws the margin beside the budget, labels its time axis
densely and says why it recommends what it does."""

from __future__ import annotations

import pytest
from dashboard_harness import chart_traces, shoot, sign_in
from playwright.sync_api import expect
from test_dashboard import ROWS, axis

STEPS = 3


def test_a_job_page_gives_the_phones_time_and_draws_loss_against_it(page, service):
    dataset = service.upload("phone-time.jsonl", ROWS)[1]["id"]
    status, job = service.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": dataset, "device": "pixel-8",
        "hyperparameters": {"steps": STEPS, "seq_len": 32}})
    assert status == 201, job
    per_step = job["progress"]["device_step_time_s_estimate"]
    assert per_step > 0
    sign_in(page, service.api_key)
    page.goto(f"/jobs/{job['id']}")
    expect(page.locator("#job-device-step-time")).to_have_text(f"{per_step:.3g} s")
    expect(page.locator("#job-device-time")).to_have_text(
        f"{job['progress']['device_time_s_estimate']:,.0f} s")
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=120_000)
    train = lambda: next(t for t in chart_traces(page, "loss-chart")  # noqa: E731
                         if t["name"] == "train loss")
    expect(page.locator("#loss-chart .scatterlayer .point").first).to_be_visible()
    steps = train()["x"]
    assert steps == list(range(1, STEPS + 1)), steps
    page.select_option("#loss-x", "device")
    assert train()["x"] == pytest.approx([step * per_step for step in steps])
    assert "estimated seconds on pixel-8" in axis(page, "loss-chart", "xaxis")["title"]
    shoot(page, "job-phone-time")
    page.select_option("#loss-x", "step")
    assert train()["x"] == steps


def test_the_explorer_draws_the_margin_and_says_why_it_recommends(page, service):
    """At 1024 MB with the 10% margin, configurations fit below 931 MB: that line is drawn
    where the chart puts 931 MB; the recommendation is the smallest within 3% of the
    fastest, and a job left on auto runs the fastest."""
    sign_in(page, service.api_key)
    page.goto("/explorer?model=preset:qwen2.5-0.5b&device=iphone-15-pro-max&seq_len=256")
    label = page.locator(".annotation-text", has_text="fits below 931 MB (10% margin)")
    expect(label).to_be_visible()
    drawn, expected = page.evaluate("""(() => {
        const gd = document.getElementById("tradeoff-chart"), xa = gd._fullLayout.xaxis;
        const left = gd.getBoundingClientRect().left;
        const lines = Array.from(gd.querySelectorAll(".shapelayer path"))
            .map((p) => p.getBoundingClientRect().left - left);
        return [lines, xa._offset + xa.c2p(1024 / 1.1)];
    })()""")
    assert any(abs(at - expected) < 4 for at in drawn), (drawn, expected)
    ticks = axis(page, "tradeoff-chart", "yaxis")["ticktext"]
    assert 5 <= len(ticks) <= 15, ticks
    expect(page.locator("#recommended")).to_contain_text(
        "smallest within 3% of the fastest that fits")
    status, plan = service.request(
        "GET", "/v1/plans?model=preset:qwen2.5-0.5b&device=iphone-15-pro-max&seq_len=256")
    assert status == 200, plan
    expect(page.locator("#recommended code").first).to_have_text(
        plan["recommendation"]["configuration"])
    expect(page.locator("#recommended-auto")).to_contain_text(plan["auto"])
    shoot(page, "explorer-margin")
    page.fill("input[name=time_tolerance]", "0")
    page.click("#explorer-form button[type=submit]")
    expect(page.locator("#recommended code").first).to_have_text(plan["auto"])
    expect(page.locator("#recommended-auto")).to_have_count(0)
