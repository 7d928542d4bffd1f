"""Issue 41 in a real browser, on real traces: each of its items as the explorer shows it, read from
what Chromium drew (page text, the grids' DOM and painted cells, the charts' SVG). The store holds
the demo's runs filed under host `vm` (as on the machine that imports) beside real files from
../shared/fixtures: a relative-time Nsight export (no wall clock, twice), a multi-GPU one
(CloverLeaf, four A100s described, work on one), host-less Kineto traces (ProfilerStep steps; and
two step-less ones describing eight GPUs each). Skipped where the fixtures are absent; screenshots
in test-artifacts/browser-real/."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from query.client import Client
from query.stepwindow import gpu_time_over
from store.store import Store
from tests.conftest import FIXTURES
from tests.test_browser import (
    CHROMIUM,
    FLAGS,
    HEIGHT,
    PAINTED,
    WIDTH,
    chart_texts,
    free_port,
    hover,
    painted,
    playwright,
    screenshot,
    svg_texts,
    visit,
)
from tracehouse import units
from tracehouse.cli.demo import load_demo
from tracehouse.cli.main import main as cli
from tracehouse.cli.serve import create_server
from tracehouse.cli.up import start_ui, stop_process
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.shortnames import unique_short_names

NSYS, KINETO = FIXTURES / "nsys", FIXTURES / "kineto"
FILES = {
    "relative": NSYS / "nsys-2021.2-mordred-report1.sqlite",  # nsys 2021.2: no session start
    "relative_v2": NSYS / "nsys-2021.2-mordred-report1-v2.sqlite",
    "multi_gpu": NSYS / "nsys-2024.5-pipit-cloverleaf-4xa100.sqlite",
    "steps": KINETO / "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # ProfilerStep#N
    "stepless": KINETO / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
    "stepless_2": KINETO / "critical_path_simple_add_benchmark_result_493459_1694039959_trace.json.gz",
}
IMPORTING_HOST = "vm"  # the machine that imports: host-less traces must not be filed as its GPUs
SHOTS = "browser-real"
PROBE = "void probe_group_by_GPU2<128, 4>("  # the relative-time export's longest kernel, at +2.048554 s
DATE_1970 = re.compile(r"1970-01-01")

if not all(path.exists() for path in FILES.values()):
    pytest.skip(f"real traces missing under {FIXTURES}", allow_module_level=True)


@dataclass(frozen=True)
class Explorer:
    url: str
    address: str
    runs: dict[str, str]  # FILES' keys, and "demo" (the demo's baseline): run ids


@pytest.fixture(scope="module")
def explorer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Explorer]:
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('browser-real') / 'store'}", DEFAULT_LIMITS)
    server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
    address = f"127.0.0.1:{server.port}"
    try:
        load_demo(address, IMPORTING_HOST, time.time_ns())
        runs: dict[str, str] = {}
        for key, path in FILES.items():
            writer = BatchWriter(address)
            try:
                runs[key] = import_export(path, writer, default_host=IMPORTING_HOST).run_id
            finally:
                writer.close()
        with Client(address, timeout=30) as client:
            runs["demo"] = str(client.runs().set_index("name")["run_id"]["demo baseline"])
        port = free_port()
        process = start_ui(address, port)
        try:
            yield Explorer(f"http://127.0.0.1:{port}", address, runs)
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


@pytest.fixture(scope="module")
def client(explorer: Explorer) -> Iterator[Client]:
    with Client(explorer.address, timeout=60) as opened:
        yield opened


# -- reading a page -----------------------------------------------------------------------------


def text_of(page: Any) -> str:
    """What the page says in words: its main pane and its sidebar."""
    return (
        str(page.locator("[data-testid=stMain]").inner_text())
        + "\n"
        + str(page.locator("[data-testid=stSidebar]").inner_text())
    )


def grid(page: Any, index: int = 0) -> list[dict[str, str]]:
    """The `index`th visible grid's rows as drawn, by header (the columns in view)."""
    return list(
        page.evaluate(
            """index => {
              const grids = [...document.querySelectorAll('[data-testid=stDataFrame]')].filter(g => g.offsetParent);
              const table = grids[index].querySelector('table');
              const heads = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
              return [...table.querySelectorAll('tbody tr')].map(tr => Object.fromEntries(
                [...tr.querySelectorAll('td')].map((td, i) => [heads[i], td.textContent.trim()])));
            }""",
            index,
        )
    )


def alerts(page: Any) -> dict[str, list[str]]:
    """The coloured boxes of the main pane, by kind (Success, Warning, Info, Error)."""
    found: dict[str, list[str]] = {}
    for kind in ("Success", "Warning", "Info", "Error"):
        found[kind] = page.locator(f"[data-testid=stMain] [data-testid=stAlertContent{kind}]").all_inner_texts()
    return found


def open_expander(page: Any, label: str) -> None:
    page.get_by_text(label, exact=True).click()
    page.wait_for_timeout(1500)


def cli_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert cli(list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


# -- item 1: a run without a wall clock ---------------------------------------------------------


def test_a_run_without_a_wall_clock_reads_as_offsets_on_every_page(
    explorer: Explorer, client: Client, page: Any
) -> None:
    relative = explorer.runs["relative"]
    visit(page, explorer.url, "runs", tables=1, folder=SHOTS)
    assert "no wall clock" in painted(page) and not any(DATE_1970.search(t) for t in painted(page))

    visit(page, f"{explorer.url}/timeline?run={relative}", "relative-timeline", charts=1, folder=SHOTS)
    said = text_of(page)
    assert not DATE_1970.search(said), "no 1970 date on the timeline, its caption or its run picker"
    assert re.search(r"\+0 ns → \+6\.55\d s \(6\.55 s\)", said), "the window as offsets from the run's start"
    picked = page.get_by_role("combobox", name="Run").input_value()
    assert picked.endswith(" · no wall clock"), f"the run picker says so: {picked}"
    titles = " ".join(chart_texts(page)["titles"])
    assert "time from the run's start (s)" in titles and not DATE_1970.search(titles), titles

    visit(page, f"{explorer.url}/kernels?run={relative}", "relative-kernels", tables=1, charts=1, folder=SHOTS)
    page.get_by_role("tab", name="GPU time").click()
    page.wait_for_timeout(2000)
    said = text_of(page)
    assert not DATE_1970.search(said), said[:400]
    # one window for the run everywhere: the CLI's `query gpu-time --run` (no times given) says the same busy %
    busy = client.gpu_time(run=relative)["gpus"]["busy_pct"].iloc[0]
    assert units.percent(busy) in painted(page), (units.percent(busy), painted(page)[-30:])
    assert "Busy % over the window shown: +0 ns → +6.55" in said
    screenshot(page, "relative-gpu-time", SHOTS)

    visit(page, f"{explorer.url}/compare?a={relative}&b={explorer.runs['relative_v2']}", "relative-compare",
          tables=1, folder=SHOTS)  # fmt: skip
    said = text_of(page)
    assert not DATE_1970.search(said) and not any(DATE_1970.search(t) for t in painted(page))
    assert said.count("no wall clock") >= 2, "both runs named without a date"
    open_expander(page, "Every figure of both runs")
    cells = painted(page)
    assert "no wall clock" in cells and not any(DATE_1970.search(cell) for cell in cells), "every figure too"


# -- item 2: traces without a host --------------------------------------------------------------


def test_host_less_traces_keep_their_gpus_apart_from_the_importing_machine(
    explorer: Explorer, client: Client, page: Any
) -> None:
    visit(page, explorer.url, "runs-hostless", tables=1, folder=SHOTS)
    by_name = {row["name"]: row for row in grid(page)}
    names = client.runs().set_index("run_id")["name"]
    for key in ("stepless", "stepless_2", "steps", "multi_gpu"):  # 8, 8, 8 and 4 GPUs described, work on one
        assert by_name[names[explorer.runs[key]]]["gpus"] == "1", (key, by_name[names[explorer.runs[key]]])
    open_expander(page, f"GPUs ({len(client.devices())})")
    screenshot(page, "runs-gpus", SHOTS)
    devices = grid(page, 1)
    assert devices, "the GPUs are listed"
    on_vm = [row for row in devices if row.get("host") == IMPORTING_HOST]
    assert all("Simulated H100" in row.get("name", "") for row in on_vm), on_vm
    assert not [row for row in devices if "A100-PG509" in row.get("name", "") and row.get("host") == IMPORTING_HOST]


# -- item 3: a verdict where a run has steps ----------------------------------------------------


def test_compare_does_not_say_no_steps_where_a_run_has_profiler_steps(explorer: Explorer, page: Any) -> None:
    a, b = explorer.runs["steps"], explorer.runs["stepless"]
    visit(page, f"{explorer.url}/compare?a={a}&b={b}", "steps-vs-stepless-compare", tables=1, folder=SHOTS)
    said = text_of(page)
    assert "no steps" not in said and "neither group has steps" not in said, said[:600]
    boxes = alerts(page)
    assert sum(len(found) for found in boxes.values()) == 1, f"one headline: {boxes}"


# -- item 4: one short name ---------------------------------------------------------------------


def test_a_kernel_has_one_short_name_in_the_table_the_chart_and_the_cli(
    explorer: Explorer, client: Client, page: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run = explorer.runs["steps"]
    visit(page, f"{explorer.url}/kernels?run={run}", "steps-kernels", tables=1, charts=1, folder=SHOTS)
    kernels = client.summary("kernels", run=run)
    labels = unique_short_names(kernels["name"].astype(str))
    rows = grid(page)
    shown = [row["short name"] for row in rows[:8]]
    assert shown == [labels[name] for name in kernels["name"].astype(str)[:8]], "the table's names are the one"
    ticks = svg_texts(page, ".js-plotly-plot >> nth=0 >> .ytick text")
    assert ticks[:8] == shown, "the chart labels its bars by the same names"
    printed = cli_text(capsys, "query", "kernels", "--run", run, "--server", explorer.address)
    missing = [name for name in shown if name not in printed]
    assert not missing, f"the CLI prints other names for {missing}"
    whole = str(kernels["name"].iloc[0])
    label = hover(page, ".js-plotly-plot .barlayer .point")
    assert whole in label, f"the hover holds the name whole: {label[:300]}"


# -- item 5: the explorer -----------------------------------------------------------------------


def test_a_busy_share_is_drawn_on_a_whole_scale(explorer: Explorer, page: Any) -> None:
    visit(page, f"{explorer.url}/kernels?run={explorer.runs['relative']}", "relative-kernels-2", charts=1,
          folder=SHOTS)  # fmt: skip
    page.get_by_role("tab", name="GPU time").click()
    page.wait_for_timeout(2000)
    chart = page.locator(".js-plotly-plot").filter(has_text="busy share per GPU")
    ticks = chart.locator(".xtick text").all_text_contents()
    assert ticks[0] == "0" and ticks[-1] == "100", ticks
    bar, area = chart.locator(".barlayer .point").first.bounding_box(), chart.locator(".nsewdrag").first.bounding_box()
    assert bar["width"] < 0.02 * area["width"], "0.1 % busy fills a sliver of the axis, not all of it"


def test_wide_timeline_slices_carry_their_short_name(explorer: Explorer, client: Client, page: Any) -> None:
    relative = explorer.runs["relative"]
    url = f"{explorer.url}/timeline?run={relative}&from=2048000000&to=2052000000"  # 4 ms around one long kernel
    visit(page, url, "relative-timeline-zoomed", charts=1, folder=SHOTS)
    drawn = svg_texts(page, ".js-plotly-plot .barlayer text")
    names = client.summary("kernels", run=relative)["name"].astype(str)
    probe = next(name for name in names if name.startswith(PROBE))
    assert unique_short_names(names)[probe] in drawn, drawn
    assert "cudaEventSynchronize" in drawn, drawn
    assert all(len(text) <= 60 for text in drawn) and "" not in drawn


def test_compare_has_one_headline_in_the_colour_it_means(explorer: Explorer, page: Any) -> None:
    a, b = explorer.runs["relative"], explorer.runs["relative_v2"]  # B is the slower (6.55 s → 39.7 s)
    visit(page, f"{explorer.url}/compare?a={a}&b={b}", "relative-compare-headline", tables=2, folder=SHOTS)
    [(kind, said)] = [(kind, said) for kind, found in alerts(page).items() for said in found]  # one headline
    word = re.search(r"\bis (?:[\d.]+ % )?(faster|slower) than\b", said)
    assert kind == {"faster": "Success", "slower": "Warning"}.get(word.group(1) if word else "", "Info"), (kind, said)
    rows = grid(page, 1)  # the changes: a kernel only one run ran reads blank in the other's column
    only_a = [row for row in rows if row["short name"].startswith("probe_group_by_GPU2")]
    assert only_a and only_a[0]["total B"] == "" and only_a[0]["total A"], only_a  # the DOM holds the values
    assert not any(row.get("total A") == "0" or row.get("total B") == "0" for row in rows), "none reads as 0 ns"


def test_counts_read_with_thousands_separators_in_the_changes(explorer: Explorer, page: Any) -> None:
    a, b = explorer.runs["steps"], explorer.runs["stepless"]
    visit(page, f"{explorer.url}/compare?a={a}&b={b}", "steps-compare-columns", tables=2, folder=SHOTS)
    open_expander(page, "Every column of the changes (instances, averages)")
    cells = painted(page)
    assert "4,350" in cells, "cudaLaunchKernel's 4350 instances"
    assert "4350" not in cells


def test_the_runs_table_shows_tags_whole(explorer: Explorer, page: Any) -> None:
    """'demo=tru' was cut by its column: each tag is drawn whole inside the tags column."""
    visit(page, explorer.url, "runs-tags", tables=1, folder=SHOTS)
    drawn = page.evaluate("window.__painted")
    header_y = min(item["y"] for item in drawn)
    heads = {item["text"]: item["x"] for item in drawn if item["y"] == header_y}
    after = min(x for text, x in heads.items() if x > heads["tags"])  # where the next column's header starts
    tags = [item for item in drawn if item["text"] == "demo=true"]
    assert tags, "the demo's tag is drawn"
    assert all(item["x"] + item["w"] <= after - 4 for item in tags), ("demo=true runs past its column", tags, heads)


def test_a_run_without_telemetry_or_a_capture_says_so(explorer: Explorer, page: Any) -> None:
    visit(page, f"{explorer.url}/timeline?run={explorer.runs['stepless']}", "stepless-timeline", charts=1,
          folder=SHOTS)  # fmt: skip
    said = text_of(page)
    assert "This run has no telemetry" in said and "No options to select" not in said
    open_expander(page, "Capture: profile this run's next steps")
    said = text_of(page)
    assert "Only a running process" in said and "capture --run" not in said, "no command that would fail"
    screenshot(page, "stepless-capture", SHOTS)


def test_the_sql_chart_names_its_axis_in_words(explorer: Explorer, page: Any) -> None:
    visit(page, f"{explorer.url}/sql", "sql-real", tables=1, charts=1, folder=SHOTS)
    titles = chart_texts(page)["titles"]
    assert any(re.fullmatch(r"total \((ns|µs|ms|s)\)", title) for title in titles), titles
    assert not any("total_ns" in title for title in titles)


# -- item 6: CLI edges, as the SQL page shows them -----------------------------------------------


def test_sql_on_a_column_that_is_not_there_names_the_real_ones(explorer: Explorer, page: Any) -> None:
    visit(page, f"{explorer.url}/sql", "sql-before-error", tables=1, folder=SHOTS)
    page.get_by_label("Read-only SQL (one SELECT or WITH query)").fill("SELECT end_ns FROM events LIMIT 1")
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_selector("[data-testid=stAlertContentError]", timeout=60_000)
    said = " ".join(page.locator("[data-testid=stAlertContentError]").all_inner_texts())
    screenshot(page, "sql-error", SHOTS)
    assert "DateTime64" in said and re.search(r"\bstart\b", said) and re.search(r"\bend\b", said), said


# -- item 7: which window a busy % is over -------------------------------------------------------


def test_busy_share_says_its_window_and_offers_the_profiler_steps(
    explorer: Explorer, client: Client, page: Any
) -> None:
    run = explorer.runs["steps"]
    visit(page, f"{explorer.url}/kernels?run={run}", "steps-gpu-time", charts=1, folder=SHOTS)
    page.get_by_role("tab", name="GPU time").click()
    page.wait_for_timeout(2000)
    assert "Busy % over the window shown:" in text_of(page)
    over_run = client.gpu_time(run=run)["gpus"]["busy_pct"].iloc[0]
    assert units.percent(over_run) in painted(page)
    steps = gpu_time_over(client, "profiler-steps", 0, 0, run=run)["gpus"]
    page.get_by_text(re.compile(r"^profiler-steps \(")).click()
    page.wait_for_timeout(2500)
    said = text_of(page)
    assert f"Busy % over {steps['window'].iloc[0]}:" in said, said[:600]
    assert units.percent(steps["busy_pct"].iloc[0]) in painted(page)
    assert units.percent(steps["busy_pct"].iloc[0]) != units.percent(over_run), "the steps' window is another"
    screenshot(page, "steps-gpu-time-over-steps", SHOTS)
