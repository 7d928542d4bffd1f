"""The explorer in a real browser: headless Chromium (Debian's) loads the running app against
the real server, waits for the timeline to draw, and checks that the charts hold drawn data,
not just that a page came back. Screenshots are kept in test-artifacts/browser/ (or
$TRACEHOUSE_TEST_ARTIFACTS)."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.timeline_trace import Trace
from tracehouse.cli.up import start_ui, stop_process

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("TRACEHOUSE_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "test-artifacts")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]  # fmt: skip
PAGES = {"runs": "", "timeline": "timeline?run=r1", "kernels": "kernels?run=r1", "compare": "compare?a=r1&b=r2",
         "sql": "sql"}  # fmt: skip

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError(
            f"CI needs Chromium for the browser test and {CHROMIUM} is missing: apt-get install chromium"
        )
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

playwright = pytest.importorskip("playwright.sync_api")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def ui_url(address: str, traces: dict[str, Trace]) -> Iterator[str]:
    port = free_port()
    process = start_ui(address, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process)


@pytest.fixture
def browser_page() -> Iterator[object]:
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1100})
        try:
            yield page
        finally:
            browser.close()


def test_every_page_renders_its_charts_in_chromium(ui_url: str, browser_page: object) -> None:
    page = browser_page
    folder = ARTIFACTS / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in PAGES.items():
        page.goto(f"{ui_url}/{path}")  # type: ignore[attr-defined]
        page.wait_for_selector("h1", timeout=60_000)  # type: ignore[attr-defined]
        if name in ("timeline", "kernels", "compare", "sql"):
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)  # type: ignore[attr-defined]
        page.wait_for_load_state("networkidle")  # type: ignore[attr-defined]
        page.screenshot(path=str(folder / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]
        assert page.locator("[data-testid='stException']").count() == 0, name  # type: ignore[attr-defined]
        assert page.locator("[data-testid='stAlertContentError']").count() == 0, name  # type: ignore[attr-defined]
    page.goto(f"{ui_url}/timeline?run=r1&metrics=gpu.util_pct")  # type: ignore[attr-defined]
    page.wait_for_selector(".js-plotly-plot .scatterlayer path.js-line", timeout=60_000)  # type: ignore[attr-defined]
    lines = page.locator(".js-plotly-plot .scatterlayer path.js-line")  # type: ignore[attr-defined]
    assert lines.count() == 2  # one per GPU
    drawn = [lines.nth(i).get_attribute("d") or "" for i in range(lines.count())]
    assert all(d.count("L") > 100 for d in drawn), "each series is drawn through its points"
    cells = page.locator(".js-plotly-plot .heatmaplayer image")  # type: ignore[attr-defined]
    assert cells.count() == 1, "the lanes are drawn"
    assert "GPU 0 · stream 7" in page.locator(".js-plotly-plot").inner_text()  # type: ignore[attr-defined]
    page.screenshot(path=str(folder / "timeline-drawn.png"), full_page=True)  # type: ignore[attr-defined]
