"""The explorer in a real browser, as a person meets it: headless Chromium (Debian's) at 1280 by 900
loads every page of the running app on the demo's runs (imported through the real importer) and
on a real Nsight Systems export (CloverLeaf, skipped where the fixtures are absent), and reads
what is drawn: the tables' cells as painted on their canvas, the charts' tick labels, axis titles
and hovers. Screenshots are kept in test-artifacts/browser/ (or $TRACEHOUSE_TEST_ARTIFACTS)."""

from __future__ import annotations

import html
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from query.client import Client
from store.store import Store
from tests.conftest import FIXTURES
from tracehouse.cli.demo import load_demo
from tracehouse.cli.serve import create_server
from tracehouse.cli.up import start_ui, stop_process
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.shortnames import unique_short_names

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("TRACEHOUSE_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "test-artifacts")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]  # fmt: skip
WIDTH, HEIGHT = 1280, 900
CLOVERLEAF = FIXTURES / "nsys" / "nsys-2024.5-pipit-cloverleaf-4xa100.sqlite"
RAW = re.compile(r"\b\d{10,}\b")  # ns since the epoch, or ns and bytes no person should count digits of;
# \b: a run id's hex digits (nsys-75a9707e203d44323946917d) are a name, not a number
DURATION = re.compile(r"\d (ns|µs|ms|s|min)\b")
# Streamlit's tables paint their cells on a canvas: record every text painted, with where
PAINTED = """
window.__painted = [];
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
  const m = this.getTransform(), ratio = window.devicePixelRatio || 1;
  window.__painted.push({text: String(text), x: (m.a * x + m.e) / ratio, y: (m.d * y + m.f) / ratio,
                         w: this.measureText(String(text)).width * m.a / ratio});
  return fillText.call(this, text, x, y, ...rest);
};
"""

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError(
            f"CI needs Chromium for the browser test and {CHROMIUM} is missing: apt-get install chromium"
        )
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

playwright = pytest.importorskip("playwright.sync_api")


@dataclass(frozen=True)
class Explorer:
    url: str
    baseline: str  # the demo's runs
    tuned: str
    cloverleaf: str  # "" without the fixtures
    address: str = ""  # the server's


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def explorer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Explorer]:
    """One store and server with the demo's runs and CloverLeaf imported, and one UI over them."""
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('browser') / 'store'}", DEFAULT_LIMITS)
    server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
    address = f"127.0.0.1:{server.port}"
    try:
        load_demo(address, "node-1", time.time_ns())
        cloverleaf = ""
        if CLOVERLEAF.exists():
            writer = BatchWriter(address)
            try:
                cloverleaf = import_export(CLOVERLEAF, writer).run_id
            finally:
                writer.close()
        with Client(address, timeout=30) as client:
            runs = client.runs().set_index("name")["run_id"]
        port = free_port()
        process = start_ui(address, port)
        try:
            yield Explorer(f"http://127.0.0.1:{port}", runs["demo baseline"], runs["demo tuned"], cloverleaf, address)
        finally:
            stop_process(process)
    finally:
        server.stop(grace=5)
        store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as driver:
        opened = driver.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield opened
        finally:
            opened.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    opened.add_init_script(PAINTED)
    try:
        yield opened
    finally:
        opened.close()


# -- what a page shows ----------------------------------------------------------------------------


def visit(page: Any, url: str, name: str, tables: int = 0, charts: int = 0, folder: str = "browser") -> None:
    """Load a page and wait for its tables and charts; fail on an exception or an error box."""
    page.goto(url)
    page.wait_for_selector("h1", timeout=60_000)
    if charts:
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
    if tables:
        page.wait_for_selector("[data-testid='stDataFrame'] table td", timeout=60_000, state="attached")
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(500)  # the grids paint on the next frames
    assert page.locator("[data-testid='stException']").count() == 0, name
    assert page.locator("[data-testid='stAlertContentError']").count() == 0, name
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH, f"{name}: the page scrolls sideways"
    screenshot(page, name, folder)


def screenshot(page: Any, name: str, under: str = "browser") -> None:
    """The whole page, for a person to look at: Streamlit scrolls inside its main pane, so the
    viewport is made as tall as that pane's content for the picture, then put back. The docs show
    those under browser/ (tools/docsite/screenshots.py)."""
    folder = ARTIFACTS / under
    folder.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    tall = page.evaluate(
        "Math.max(...[...document.querySelectorAll('[data-testid=stMain], section')].map(e => e.scrollHeight))"
    )
    page.set_viewport_size({"width": size["width"], "height": min(max(size["height"], int(tall) + 40), 8000)})
    page.wait_for_timeout(300)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)
    page.wait_for_timeout(300)


def sideways(page: Any) -> list[int]:
    """How far each visible grid scrolls sideways, in px (0: every column in view)."""
    return list(
        page.evaluate(
            "[...document.querySelectorAll('[data-testid=stDataFrame] .dvn-scroller')]"
            ".filter(e => e.offsetParent !== null).map(e => e.scrollWidth - e.clientWidth)"
        )
    )


def painted(page: Any) -> list[str]:
    """Every text the tables painted so far."""
    return [str(item["text"]) for item in page.evaluate("window.__painted")]


def chart_texts(page: Any) -> dict[str, list[str]]:
    """The charts' tick labels and axis titles, as drawn."""
    return {
        "ticks": svg_texts(page, ".js-plotly-plot .xtick text, .js-plotly-plot .ytick text"),
        "titles": svg_texts(page, ".js-plotly-plot .infolayer text[class$='title']"),
    }


def svg_texts(page: Any, selector: str) -> list[str]:
    return [str(text) for text in page.locator(selector).evaluate_all("found => found.map(e => e.textContent)")]


def hover(page: Any, selector: str, index: int = 0) -> str:
    """Move the mouse across a drawn mark until a hover label shows, and read it."""
    mark = page.locator(selector).nth(index)
    mark.scroll_into_view_if_needed()
    box = mark.bounding_box()
    assert box is not None, selector
    for share in (0.5, 0.3, 0.7, 0.1, 0.9, 0.2, 0.4, 0.6, 0.8):
        for row in (0.5, 0.1, 0.9):
            page.mouse.move(box["x"] + box["width"] * share, box["y"] + box["height"] * row)
            page.wait_for_timeout(100)
            if page.locator(".hoverlayer .hovertext").count():
                return " ".join(svg_texts(page, ".hoverlayer .hovertext"))
    raise AssertionError(f"no hover label over {selector}")


def bar_names(page: Any, index: int = 0) -> list[str]:
    """The full names the `index`th bar chart keys its bars by (plotly's own data)."""
    return [
        html.unescape(name)
        for name in page.evaluate(f"document.querySelectorAll('.js-plotly-plot')[{index}].data[0].y")
    ]


def assert_readable(texts: list[str], where: str) -> None:
    raw = [text for text in texts if RAW.search(text)]
    assert not raw, f"{where}: raw numbers {raw[:5]}"


# -- the pages --------------------------------------------------------------------------------------


def test_the_demo_reads_in_human_units_on_every_page(explorer: Explorer, page: Any) -> None:
    visit(page, explorer.url, "runs", tables=1)
    assert_readable(painted(page), "runs table")
    assert max(sideways(page)) <= 1, "every column of the runs in view at 1280 px, none cut at the edge"

    visit(page, f"{explorer.url}/kernels?run={explorer.baseline}", "kernels", tables=1, charts=1)
    cells = painted(page)
    assert_readable(cells, "kernels table")
    assert any(DURATION.search(cell) for cell in cells), cells[:20]
    drawn = chart_texts(page)
    assert_readable(drawn["ticks"], "kernels chart ticks")
    assert any(re.search(r"total time \((ns|µs|ms|s)\)", title) for title in drawn["titles"]), drawn["titles"]
    names = bar_names(page)
    assert len(set(names)) == len(names) == page.locator(".js-plotly-plot").first.locator(".barlayer .point").count()
    label = hover(page, ".js-plotly-plot .barlayer .point")
    assert DURATION.search(label) and names[0][:40] in label, label
    assert_readable([label], "kernels hover")

    visit(page, f"{explorer.url}/timeline?run={explorer.baseline}&metrics=gpu.util_pct,gpu.mem_used_bytes", "timeline",
          charts=1)  # fmt: skip
    drawn = chart_texts(page)
    assert_readable(drawn["ticks"], "timeline ticks")
    titles = " ".join(drawn["titles"])
    assert "gpu.util_pct (%)" in titles and "gpu.mem_used_bytes (GiB)" in titles, titles
    assert re.search(r"time from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC \((s|ms|µs)\)", titles), titles
    assert "share of bucket busy, %" in svg_texts(page, ".js-plotly-plot .colorbar .cbtitle")
    label = hover(page, ".js-plotly-plot .scatterlayer .trace:first-child path.js-line")
    assert re.search(r"\+\d.*\d %", label, re.S), label  # an offset and a percentage
    assert_readable([label], "timeline hover")
    assert page.get_by_text("https://ui.perfetto.dev").count() == 1

    visit(page, f"{explorer.url}/compare?a={explorer.baseline}&b={explorer.tuned}", "compare", tables=1)
    headline = page.get_by_text(re.compile(r"\b(faster|slower)\b")).first
    box = headline.bounding_box()
    assert box is not None and box["y"] + box["height"] <= HEIGHT, "the answer is in the first screen"
    assert_readable(painted(page), "compare tables")
    overflow = sideways(page)
    assert overflow and max(overflow) <= 1, f"Compare's tables fit 1280 px without scrolling sideways: {overflow}"

    visit(page, f"{explorer.url}/sql", "sql", tables=1, charts=1)
    cells = painted(page)
    assert_readable(cells, "sql result")
    assert any(DURATION.search(cell) for cell in cells), "total_ns reads as a duration"
    assert_readable(chart_texts(page)["ticks"], "sql chart ticks")


def test_cloverleaf_kernels_chart_agrees_with_its_table(explorer: Explorer, page: Any) -> None:
    if not explorer.cloverleaf:
        pytest.skip(f"no {CLOVERLEAF}")
    visit(page, f"{explorer.url}/kernels?run={explorer.cloverleaf}", "cloverleaf-kernels", tables=1, charts=1)
    names = bar_names(page)
    assert len(set(names)) == len(names) == 20, "every bar is one kernel, named in full"
    # the grid keeps only the columns in view in its DOM: the first row's first cell is its label
    short = page.locator("[data-testid='stDataFrame'] table tbody tr").first.locator("td").first.text_content()
    assert names[0].startswith("void clover::par_ranged2d_kernel<PdV_kernel(")
    label = hover(page, ".js-plotly-plot .barlayer .point")
    assert "19.4 ms" in label and "PdV_kernel" in label, label
    ticks = svg_texts(page, ".js-plotly-plot >> nth=0 >> .ytick text")
    assert len(set(ticks)) == len(ticks) == 20, "the labels shown are distinct too"
    assert ticks[0] == short and "PdV_kernel" in short, "the top bar is the table's top kernel, by the same label"
    cells = painted(page)
    assert_readable(cells, "cloverleaf kernels table")
    assert "19.4 ms" in cells
    sorted_by_total = sort_by(page, "total")
    assert sorted_by_total == sorted(sorted_by_total), "sorted by the value, not by the text shown"

    page.get_by_role("tab", name="GPU time").click()  # spans and gaps: epoch ns past 2**53 underneath
    for grid in page.locator("[data-testid='stDataFrame']").all():
        if grid.is_visible():
            grid.scroll_into_view_if_needed()
            page.wait_for_timeout(800)
    cells = painted(page)
    assert_readable(cells, "cloverleaf GPU time tables")
    assert any(re.fullmatch(r"\+\d+\.\d{3} ms", cell) for cell in cells), "gaps start at offsets from the window"
    screenshot(page, "cloverleaf-gpu-time")

    visit(page, f"{explorer.url}/timeline?run={explorer.cloverleaf}&metrics=none", "cloverleaf-timeline", charts=1)
    assert_readable(chart_texts(page)["ticks"], "cloverleaf timeline ticks")
    label = hover(page, ".js-plotly-plot .heatmaplayer image")
    assert "busy" in label and "%" in label, label
    assert_readable([label], "cloverleaf timeline hover")

    # zoomed in around its longest kernel, slices are drawn one by one, the wide ones labelled
    with Client(explorer.address, timeout=30) as client:
        longest = client.sql(
            "SELECT name, toUnixTimestamp64Nano(start) AS start_ns, toUnixTimestamp64Nano(end) AS end_ns "
            f"FROM events WHERE run_id = '{explorer.cloverleaf}' AND kind = 'kernel' "
            "ORDER BY end_ns - start_ns DESC LIMIT 1"
        ).iloc[0]
        names = client.summary("kernels", run=explorer.cloverleaf)["name"].astype(str)
    width = int(longest["end_ns"] - longest["start_ns"])
    start, end = int(longest["start_ns"]) - width // 2, int(longest["end_ns"]) + width // 2
    visit(page, f"{explorer.url}/timeline?run={explorer.cloverleaf}&metrics=none&from={start}&to={end}",
          "cloverleaf-timeline-zoomed", charts=1)  # fmt: skip
    drawn = svg_texts(page, ".js-plotly-plot .barlayer text")
    assert unique_short_names(names)[str(longest["name"])] in drawn, f"the kernel's slice is labelled: {drawn}"


def sort_by(page: Any, header: str) -> list[int]:
    """Click a column's header in the first table; its values, as stored, top to bottom."""
    grid = page.locator("[data-testid='stDataFrame']").first
    grid.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    box = grid.bounding_box()
    column = page.locator("[data-testid='stDataFrame'] table thead th").all_inner_texts().index(header)
    at = next(item for item in page.evaluate("window.__painted") if item["text"] == header)
    page.mouse.click(box["x"] + at["x"] + 5, box["y"] + 17)
    page.wait_for_timeout(800)
    rows = page.locator("[data-testid='stDataFrame']").first.locator("table tbody tr")
    return [int(float(rows.nth(i).locator("td").nth(column).text_content())) for i in range(min(8, rows.count()))]
