"""The dashboard in a real browser against `mebp serve` (the federated fleet's page is
tested beside its fleet, in test_federated)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from cpu_load import all_cores_but_one_busy
from dashboard_harness import (
    chart_traces,
    labels_outside_plot,
    point_on_page,
    shoot,
    sign_in,
)
from playwright.sync_api import Page, expect

ROWS = b"".join(json.dumps({"text": f"dashboard row {i}: phones learn on the go"}).encode()
                + b"\n" for i in range(24))


@pytest.fixture(scope="module")
def dataset_id(service) -> str:
    status, body = service.upload("dashboard.jsonl", ROWS)
    assert status == 201, body
    return body["id"]


def test_only_the_sign_in_shows_without_the_key(page, service):
    page.goto("/jobs")
    expect(page).to_have_url(service.url + "/signin")
    expect(page.locator("nav")).to_have_count(0)
    sign_in(page, "not-the-key-123")
    expect(page.locator(".error")).to_contain_text("not this service's API key")
    shoot(page, "signin-refused")
    sign_in(page, service.api_key)
    expect(page).to_have_url(service.url + "/explorer")
    page.goto("/jobs")  # the session holds for the browser session
    expect(page.locator("h1")).to_have_text("Jobs")


def test_explore_click_a_feasible_point_submit_and_watch_it_train(page, service,
                                                                   dataset_id):
    sign_in(page, service.api_key)
    page.goto("/explorer?model=preset:tiny&device=pixel-8&seq_len=64")
    chart = page.locator("#tradeoff-chart")
    expect(chart.locator(".scatterlayer .trace").first).to_be_visible()
    traces = chart_traces(page, "tradeoff-chart")
    front = next(t for t in traces if t["name"] == "Pareto front")
    assert front["x"], traces
    # with a device, the time axis is the phone's estimate and the front is the phone's
    title = page.evaluate("document.getElementById('tradeoff-chart').layout.yaxis.title.text")
    assert title == "seconds per step on Pixel 8 (estimated)"
    status, plan = service.request("POST", "/v1/plans", {
        "model": "preset:tiny", "device": "pixel-8", "seq_len": 64})
    assert status == 200 and plan["ranked_by"] == "device"
    estimates = {c["id"]: c["device_step_time_s_estimate"] for c in plan["configurations"]}
    assert sorted(front["y"]) == sorted(estimates[i] for i in plan["pareto"]
                                        if next(c for c in plan["configurations"]
                                                if c["id"] == i)["feasible"])
    shoot(page, "explorer")
    page.mouse.click(*point_on_page(page, "tradeoff-chart", "Pareto front", 0))

    expect(page).to_have_url(re.compile(r"/jobs/new\?"))
    configuration = page.locator("#configuration").text_content()
    assert configuration != "auto"
    page.select_option("select[name=training_file]", dataset_id)
    page.fill("input[name=steps]", "6")
    page.fill("input[name=learning_rate]", "0.05")
    page.select_option("select[name=validation_file]", dataset_id)
    page.fill("input[name=eval_every]", "2")
    shoot(page, "job-form")
    # started beside busy cores, the job takes one thread and its worker plans it again with
    # its one-thread calibration: the page then shows what that plan predicts
    with all_cores_but_one_busy():
        page.click("#job-form button[type=submit]")
        expect(page).to_have_url(re.compile(r"/jobs/job-[0-9a-f]+$"))
        expect(page.locator("#events li").filter(has_text="cores idle as it starts")
               ).to_have_count(1, timeout=90_000)
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=90_000)
    expect(page.locator("#downloads > a")).to_have_count(3)  # the adapter's formats
    expect(page.locator("#base-downloads a")).to_have_text(  # and its base's exports
        ["hf", "gguf", "gguf q4_1", "gguf q8_0", "mlx"])
    loss = chart_traces(page, "loss-chart")[0]
    assert loss["x"] == [1, 2, 3, 4, 5, 6] and all(value > 0 for value in loss["y"])
    validation = chart_traces(page, "loss-chart")[1]
    assert validation["x"] == [2, 4, 6] and all(value > 0 for value in validation["y"])
    memory = chart_traces(page, "memory-chart")[0]
    assert memory["x"] == [1, 2, 3, 4, 5, 6] and max(memory["y"]) < 1024
    # predicted beside measured, on the same axes: the plan's peak and step time as levels
    job_id = page.url.rsplit("/", 1)[1]
    progress = service.request("GET", f"/v1/jobs/{job_id}")[1]["progress"]
    labels = {chart: page.evaluate(f"document.getElementById('{chart}').layout.annotations"
                                   ".map((a) => a.text)") for chart in ("memory-chart",
                                                                        "time-chart")}
    assert f"predicted peak {progress['predicted_peak_mb']} MB" in labels["memory-chart"]
    assert f"predicted {progress['predicted_step_time_s']} s on this host" in \
        labels["time-chart"]
    expect(page.locator("#job-step-time")).to_have_text(f"{progress['step_time_s']:.3g} s")
    expect(page.locator("#events li").filter(has_text="succeeded")).to_have_count(1)
    shoot(page, "job-succeeded")
    with page.expect_download() as download:
        page.click("#downloads a:has-text('peft')")
    assert Path(download.value.path()).stat().st_size > 1000
    served = service.base("preset:tiny", format="gguf")  # exported in the background first
    with page.expect_download() as download:
        page.click("#base-downloads a[data-format=gguf][data-quant=int4]")
    assert Path(download.value.path()).read_bytes() == served.content
    assert served.content[:4] == b"GGUF"

    job = service.request("GET", f"/v1/jobs/{job_id}")[1]
    assert job["plan"]["configuration"] == configuration
    assert job["config"]["knobs"]["threads"] == 1 and job["plan"]["calibration"]["threads"] == 1
    expect(page.locator("#job-predicted-step-time")).to_have_text(
        f"{progress['predicted_step_time_s']:.3g} s")
    page.goto("/explorer?model=preset:tiny&device=pixel-8&seq_len=64")
    measured = next(t for t in chart_traces(page, "tradeoff-chart") if t["name"] == "measured")
    assert len(measured["x"]) >= 1


def test_points_that_do_not_fit_are_greyed_with_their_reason(page, service):
    sign_in(page, service.api_key)
    page.goto("/explorer?model=preset:tiny&device=&budget_mb=120&seq_len=256")
    expect(page.locator(".summary")).to_contain_text("none fit")
    traces = {t["name"]: t for t in chart_traces(page, "tradeoff-chart")}
    assert traces["does not fit"]["x"] and not traces["fits"]["x"]
    row = page.locator("#front-table tr.infeasible").first
    expect(row.locator("span[title]")).to_have_attribute("title", re.compile("^needs .* MB"))
    shoot(page, "explorer-infeasible")


def axis(page: Page, chart_id: str, name: str) -> dict:
    return page.evaluate(f"""(() => {{
        const a = document.getElementById("{chart_id}")._fullLayout.{name};
        return {{range: a.range, tickvals: a.tickvals, ticktext: a.ticktext,
                 title: a.title.text}};
    }})()""")


@pytest.mark.parametrize("budget_mb", [100, 65536])
def test_the_explorer_axes_hold_at_extreme_budgets(page, service, budget_mb):
    """The budget line sits at the budget on the log axis (not at 10^budget), the axes span
    the points and the budget with readable ticks, and the recommended configuration is
    starred and said in words."""
    sign_in(page, service.api_key)
    page.goto(f"/explorer?model=preset:qwen2.5-0.5b&device=&budget_mb={budget_mb}&seq_len=256")
    traces = {t["name"]: t for t in chart_traces(page, "tradeoff-chart")}
    peaks = [x for t in traces.values() for x in t["x"] if x is not None] + [budget_mb]
    x = axis(page, "tradeoff-chart", "xaxis")
    assert 10 ** x["range"][0] <= min(peaks) and max(peaks) <= 10 ** x["range"][1]
    assert 10 ** x["range"][1] < 3 * max(peaks)
    assert "MB" in x["title"] and "seconds per step" in axis(page, "tradeoff-chart",
                                                             "yaxis")["title"]
    assert len(x["ticktext"]) >= 2 and all(
        float(text.replace(",", "")) >= 10 for text in x["ticktext"])
    label = page.locator(".annotation-text", has_text=f"budget {budget_mb} MB")
    expect(label).to_be_visible()
    drawn, expected = page.evaluate(f"""(() => {{
        const gd = document.getElementById("tradeoff-chart"), xa = gd._fullLayout.xaxis;
        const line = gd.querySelector(".shapelayer path").getBoundingClientRect();
        const label = gd.querySelector(".annotation").getBoundingClientRect();
        const left = gd.getBoundingClientRect().left;
        return [[line.left - left, label.right - left], xa._offset + xa.c2p({budget_mb})];
    }})()""")
    assert all(abs(at - expected) < 4 for at in drawn), (drawn, expected)  # line and label
    if budget_mb == 100:
        expect(page.locator(".summary").first).to_contain_text("none fit")
        assert "recommended" not in traces
    else:
        star, = traces["recommended"]["x"]
        assert traces["recommended"]["x"] and star <= budget_mb
        # the smallest within 3% of the fastest: part of the weights resident, said in words
        expect(page.locator("#recommended-knobs")).to_contain_text(
            "frozen weights kept decompressed, the rest decompressed as used")
        # the knobs are columns to sort and filter by
        front = page.locator("#front-table")
        peak = front.locator("th", has_text="predicted peak MB")
        peak.click()
        peak.click()  # descending
        peaks = [float(v) for v in front.locator("tbody tr td:nth-child(8)").all_inner_texts()]
        assert peaks == sorted(peaks, reverse=True) and len(peaks) > 3
        page.click("details summary")
        page.fill("#config-filter", "resident mmap")
        shown = page.locator("#all-table tbody tr:not([hidden])")
        expect(shown.first).to_be_visible()
        assert all("resident" in t and "mmap" in t for t in shown.all_inner_texts())
        assert shown.count() < page.locator("#all-table tbody tr").count()
    shoot(page, f"explorer-budget-{budget_mb}")


def test_the_explorer_draws_the_front_graph_tails_fill_in_bfloat16(page, service):
    """qwen2.5-0.5b at seq 256 in bfloat16 (issue 34, item 4): between the checkpointed step
    and the no-checkpoint one the front is graph tails, drawn a block's activations apart and
    labelled with their tails; a tail's point opens the job form in the dtype planned."""
    sign_in(page, service.api_key)
    page.goto("/explorer?model=preset:qwen2.5-0.5b&device=&budget_mb=1024&seq_len=256"
              "&compute_dtype=bfloat16")
    expect(page.locator("select[name=compute_dtype]")).to_have_value("bfloat16")
    expect(page.locator("h2.chart-title").first).to_have_text("1024 MB, seq 256, bfloat16")
    front = page.evaluate("""(() => {
        const t = document.getElementById("tradeoff-chart").data
            .find((t) => t.name === "Pareto front");
        return {x: Array.from(t.x), ids: Array.from(t.customdata)};
    })()""")
    points = list(zip(front["x"], front["ids"], strict=True))
    no_checkpoints = min(x for x, i in points if "-nockpt-" in i)  # past it: resident weights
    between = sorted((x, i) for x, i in points if 300 <= x <= no_checkpoints)
    tails = {int(re.search(r"-tail(\d+)-", i)[1]) for _, i in between if "-tail" in i}
    assert tails >= set(range(3, 23)), between  # tails 1-2 sit below 300 MB
    assert max(b[0] - a[0] for a, b in itertools.pairwise(between)) < 26, between
    row = page.locator("#front-table tbody tr", has=page.locator("code", has_text="-tail12-"))
    expect(row.first).to_contain_text("last 12 kept")
    expect(row.first.locator("a", has_text="run")).to_have_attribute(
        "href", re.compile(r"[?&]compute_dtype=bfloat16(&|$)"))
    shoot(page, "explorer-graph-tails-bf16")
    index = front["ids"].index(next(i for _, i in between if "-tail12-" in i))
    page.mouse.click(*point_on_page(page, "tradeoff-chart", "Pareto front", index))
    expect(page).to_have_url(re.compile(r"/jobs/new\?.*compute_dtype=bfloat16"))
    expect(page.locator("#configuration")).to_contain_text("-tail")
    expect(page.locator("select[name=compute_dtype]")).to_have_value("bfloat16")


def test_two_devices_compare_side_by_side_on_the_same_axes(page, service):
    sign_in(page, service.api_key)
    page.goto("/explorer?model=preset:qwen2.5-0.5b&device=iphone-15-pro-max&seq_len=256"
              "&compare_device=iphone-13")
    first, second = axis(page, "tradeoff-chart", "xaxis"), axis(page, "tradeoff-chart-2",
                                                                  "xaxis")
    assert first["range"] == second["range"]  # read against each other
    assert axis(page, "tradeoff-chart", "yaxis")["range"] == \
        axis(page, "tradeoff-chart-2", "yaxis")["range"]
    assert "iPhone 13" in axis(page, "tradeoff-chart-2", "yaxis")["title"]
    labels = page.locator(".annotation-text")
    expect(labels.filter(has_text="budget 1024 MB")).to_have_count(1)
    expect(labels.filter(has_text="budget 512 MB")).to_have_count(1)
    expect(page.locator("h2.chart-title").nth(1)).to_contain_text("iphone-13, seq 256")
    shoot(page, "explorer-compare")


def test_the_jobs_list_is_live_and_a_job_can_be_cancelled_from_its_page(page, service,
                                                                         dataset_id,
                                                                         cancel_at_end):
    status, job = service.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": dataset_id, "device": "pixel-8",
        "hyperparameters": {"steps": 100_000, "seq_len": 32}})
    assert status == 201
    cancel_at_end(service, job["id"])
    sign_in(page, service.api_key)
    page.goto("/jobs")
    row = page.locator(f"tr[data-job='{job['id']}']")
    expect(row.locator(".badge")).to_have_text("running", timeout=60_000)
    first = int(row.locator("progress").get_attribute("value"))
    # the next step's progress (waited for, not timed: a busy host may take a while)
    expect(row.locator("progress")).not_to_have_attribute("value", str(first), timeout=90_000)
    shoot(page, "jobs-live")
    page.goto(f"/jobs/{job['id']}")
    page.click("#cancel")
    expect(page.locator("#job-status")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#downloads")).to_be_visible()
    shoot(page, "job-cancelled")


def test_a_fleet_page_shows_each_device_and_only_the_fleets_jobs(page, service, dataset_id):
    """A table row and a legend entry per device, predicted beside measured, final loss
    against budget; a job of another method on the same data is not drawn."""
    status, fleet = service.request("POST", "/v1/fleets", {
        "model": "preset:tiny", "training_file": dataset_id,
        "devices": ["pixel-8", "iphone-15"], "hyperparameters": {"steps": 3, "seq_len": 32}})
    assert status == 201, fleet
    status, mezo = service.request("POST", "/v1/jobs", {
        "model": "preset:tiny", "training_file": dataset_id, "device": "pixel-8",
        "method": "mezo", "hyperparameters": {"steps": 3, "seq_len": 32}})
    assert status == 201, mezo
    for job_id in [m["job_id"] for m in fleet["members"]] + [mezo["id"]]:
        assert service.finished(job_id)["status"] == "succeeded"
    sign_in(page, service.api_key)
    page.goto(f"/fleets/{fleet['id']}")
    rows = page.locator("#device-table tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#device-table tr[data-status=succeeded]")).to_have_count(2)
    for index in range(2):  # predicted / measured: both figures, for memory and time
        cells = rows.nth(index).locator("td")
        for column in (3, 4):
            predicted, measured = (float(v) for v in cells.nth(column).inner_text().split("/"))
            assert predicted > 0 and measured > 0
    losses = chart_traces(page, "loss-chart")
    assert sorted(t["name"] for t in losses) == ["iphone-15", "pixel-8"]
    assert all(len(t["x"]) == 3 for t in losses)
    shown = page.evaluate("document.getElementById('loss-chart')._fullLayout.showlegend")
    assert shown
    budget, = chart_traces(page, "budget-chart")
    assert sorted(budget["x"]) == [768, 1024]
    assert labels_outside_plot(page, "budget-chart") == []
    expect(page.locator("#fleet-status")).to_have_text("The fleet is done.")
    loss = service.request("GET", f"/v1/fleets/{fleet['id']}")[1]["summary"]["final_loss"]
    expect(page.locator("#fleet-loss")).to_have_text(
        f"Mean final training loss {loss['mean']:.4f} ({loss['min']:.4f}–{loss['max']:.4f}) "
        "over its succeeded devices.")
    shoot(page, "fleet")
    page.goto("/fleets")
    expect(page.locator(f"a[href='/fleets/{fleet['id']}']")).to_be_visible()
    expect(page.locator("tr", has=page.locator(f"a[href='/fleets/{fleet['id']}']"))
           .locator(".fleet-status")).to_have_text("done")


def test_the_api_docs_render_offline_and_every_page_has_a_favicon(page, service):
    """Swagger UI comes from the service itself (the browser reaches nothing else: every
    request off the service's origin is refused), and /favicon.ico answers."""
    foreign = []
    page.route(re.compile(r"^(?!" + re.escape(service.url) + ").*"),
               lambda route: (foreign.append(route.request.url), route.abort()))
    page.goto("/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("mebp")
    expect(page.locator(".swagger-ui .opblock-tag").first).to_be_visible()
    shoot(page, "docs")
    assert foreign == []
    icon = page.request.get("/favicon.ico")
    assert icon.ok and icon.headers["content-type"].startswith("image/svg")
    page.goto("/signin")
    assert page.locator("link[rel=icon]").get_attribute("href") == "/static/favicon.svg"
