"""The dashboard in a real browser: Playwright drives Debian's chromium headless. A page per
test, signed in as a user would, and what its charts drew read back from the page.
Screenshots are kept in test-artifacts/dashboard/."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking"]


@contextmanager
def launch_chromium() -> Iterator[Browser]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is missing: `make test` installs it (apt-get install "
                    "chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@contextmanager
def open_page(browser: Browser, base_url: str) -> Iterator[Page]:
    """A page of its own context (no cookies shared with another test)."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900},
                                  accept_downloads=True)
    yield context.new_page()
    context.close()


def sign_in(page: Page, key: str) -> None:
    page.goto("/")
    page.fill("input[name=api_key]", key)
    page.click("#signin button[type=submit]")


def shoot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def chart_traces(page: Page, chart_id: str) -> list[dict]:
    return page.evaluate(f"""document.getElementById("{chart_id}").data.map(
        t => ({{name: t.name, x: Array.from(t.x), y: Array.from(t.y)}}))""")


def point_on_page(page: Page, chart_id: str, trace_name: str, index: int) -> tuple[float, float]:
    """Where a data point is drawn, in page pixels, from the chart's own axes."""
    return page.evaluate(f"""(() => {{
        const gd = document.getElementById("{chart_id}");
        const trace = gd.data.find(t => t.name === "{trace_name}");
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const box = gd.getBoundingClientRect();
        return [box.left + xa._offset + xa.c2p(trace.x[{index}]),
                box.top + ya._offset + ya.c2p(trace.y[{index}])];
    }})()""")


def labels_outside_plot(page: Page, chart_id: str) -> list[str]:
    """The chart's point labels not wholly inside its plot area (cut, or over the axes)."""
    return page.evaluate(f"""(() => {{
        const gd = document.getElementById("{chart_id}");
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const box = gd.getBoundingClientRect();
        const left = box.left + xa._offset, top = box.top + ya._offset;
        return Array.from(gd.querySelectorAll(".textpoint text")).filter((label) => {{
            const r = label.getBoundingClientRect();
            return r.left < left || r.right > left + xa._length
                || r.top < top || r.bottom > top + ya._length;
        }}).map((label) => label.textContent);
    }})()""")
