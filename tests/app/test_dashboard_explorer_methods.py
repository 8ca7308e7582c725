"""The explorer shows methods (issue 30, item 3), in a real browser against `mebp serve`:
every method's front on one chart, the recommendation naming its method, one method alone,
and the time to a loss a comparison measured, started from the explorer's own button."""

from __future__ import annotations

import re

from dashboard_harness import shoot, sign_in
from playwright.sync_api import Page, expect
from service_harness import create_key
from test_api_comparisons import HELD_OUT, ROWS

from app.comparison_sentence import phone_time

EXPLORER = "/explorer?model=preset:tiny&device=pixel-8&seq_len=32"
NAMES = {"mebp": "MeBP", "mezo": "MeZO", "backprop": "backprop"}


def drawn_traces(page: Page) -> dict[str, dict]:
    """Each trace of the trade-off chart by name: its points' ids and markers as drawn."""
    return page.evaluate("""Object.fromEntries(
        document.getElementById("tradeoff-chart").data.map((t) => [t.name, {
            ids: Array.from(t.customdata || []), x: Array.from(t.x),
            color: (t.marker || {}).color, symbols: [].concat((t.marker || {}).symbol)}]))""")


def test_all_methods_draw_three_fronts_and_the_recommendation_names_one(page, service):
    sign_in(page, service.api_key)
    page.goto(EXPLORER)
    page.select_option("select[name=method]", "all")
    page.click("#explorer-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"[?&]method=all(&|$)"))  # the URL is the view
    expect(page.locator("#tradeoff-chart .scatterlayer .trace").first).to_be_visible()
    traces = drawn_traces(page)
    fronts = {method: traces[f"{name} front"] for method, name in NAMES.items()}
    assert all(fronts.values()) and all(f["x"] for f in fronts.values()), fronts
    assert all(i.startswith("mezo-") for i in fronts["mezo"]["ids"]), fronts
    assert fronts["backprop"]["ids"] == ["backprop"], fronts  # its knobs are fixed
    assert not any(i.startswith(("mezo", "backprop")) for i in fronts["mebp"]["ids"]), fronts
    # told apart without colour: a marker shape of its own, and a colour of its own
    shapes = {method: {s.removesuffix("-open") for s in f["symbols"]}
              for method, f in fronts.items()}
    assert all(len(s) == 1 for s in shapes.values()), shapes
    assert len({next(iter(s)) for s in shapes.values()}) == 3, shapes
    assert len({f["color"] for f in fronts.values()}) == 3, fronts
    legend = page.locator("#tradeoff-chart .legendtext").all_text_contents()
    assert {"MeBP front", "MeZO front", "backprop front"} <= set(legend), legend

    status, plans = service.request(
        "GET", "/v1/plans?model=preset:tiny&device=pixel-8&seq_len=32&method=all")
    assert status == 200, plans
    recommended = plans["recommendation"]
    expect(page.locator("#recommended-method")).to_have_text(NAMES[recommended["method"]])
    expect(page.locator("#recommended")).to_contain_text(recommended["configuration"])
    expect(page.locator("#recommended")).to_contain_text(recommended["why"])
    star, = traces["recommended"]["ids"]
    assert star == recommended["configuration"]
    for method in NAMES:  # every method's front is in the table, labelled
        expect(page.locator(f"#front-table tr[data-method={method}]").first).to_be_visible()
    shoot(page, "explorer-all-methods")


def test_one_method_shows_only_its_configurations(page, service):
    sign_in(page, service.api_key)
    page.goto(EXPLORER + "&method=mezo")
    expect(page.locator("select[name=method]")).to_have_value("mezo")
    # its steps span less than one of 1, 2, 5 x 10^k to the next: still two ticks to read by
    ticks = page.evaluate("document.getElementById('tradeoff-chart').layout.yaxis.tickvals")
    assert len(ticks) >= 2, ticks
    traces = drawn_traces(page)
    ids = [i for t in traces.values() for i in t["ids"]]
    assert ids and all(i.startswith("mezo-") for i in ids), ids
    rows = page.locator("#all-table tbody tr")
    assert rows.count() == page.locator("#all-table tbody tr[data-method=mezo]").count() > 0
    expect(page.locator("#recommended-method")).to_have_text("MeZO")
    expect(page.locator("#recommended")).to_contain_text(
        "forward passes with a seeded perturbation")
    shoot(page, "explorer-mezo")
    # a point's run link carries its method to the job form
    link = page.locator("#front-table a", has_text="run").first
    link.click()
    expect(page.locator("select[name=method]")).to_have_value("mezo")


def test_the_button_starts_a_comparison_whose_time_to_loss_the_explorer_then_shows(
        page, service):
    """A tenant of its own: the explorer shows only the signed-in tenant's comparisons."""
    key = create_key(service, "explorer-methods")
    headers = {"Authorization": f"Bearer {key}"}
    data = {}
    for field, name, rows in (("training_file", "explorer-train.jsonl", ROWS),
                              ("validation_file", "explorer-valid.jsonl", HELD_OUT)):
        answer = service.client.post("/v1/datasets", files={"file": (name, rows)},
                                     headers=headers)
        assert answer.status_code == 201, answer.text
        data[field] = answer.json()["id"]
    sign_in(page, key)
    page.goto(EXPLORER)
    expect(page.locator("#no-comparison")).to_be_visible()
    form = page.locator("#start-comparison")
    form.locator("select[name=training_file]").select_option(data["training_file"])
    form.locator("select[name=validation_file]").select_option(data["validation_file"])
    form.locator("input[name=max_steps]").fill("2")
    form.locator("button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/comparisons/cmp-[0-9a-f]+$"))
    comparison_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("#comparison-status")).to_have_text("done", timeout=300_000)
    status, done = service.request("GET", f"/v1/comparisons/{comparison_id}", key=key)
    assert status == 200, done
    assert done["model"] == "preset:tiny" and done["device"] == "pixel-8"
    assert {m["method"] for m in done["methods"]} == {"mebp", "mezo"}

    page.goto(EXPLORER)
    expect(page.locator("#comparison-sentence")).to_have_text(done["summary"])
    for outcome in done["methods"]:
        row = page.locator(f"#comparison-methods tr[data-method={outcome['method']}]")
        loss = outcome["best_val_loss"]
        assert loss is not None, outcome
        expect(row).to_contain_text(f"{loss:.4g}")
        reached = next(p for p in outcome["best_curve"] if p["val_loss"] <= loss)
        expect(row.locator("td").nth(2)).to_have_text(phone_time(reached["device_time_s"]))
    expect(page.locator("#comparison-link")).to_have_attribute(
        "href", f"/comparisons/{comparison_id}")
    shoot(page, "explorer-time-to-loss")
    page.goto(EXPLORER.replace("pixel-8", "iphone-15"))  # another device: not this one's
    expect(page.locator("#no-comparison")).to_be_visible()
