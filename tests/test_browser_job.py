"""The Job page in a real browser (Debian's Chromium, as tests/test_browser.py drives it): a click on the
heat map's cell of the straggler (tests/job_trace.py: rank 5 of 8, two hosts whose clocks are 50 ms apart)
gives the link to its timeline at that step; the timeline draws rank 5's lanes on top and its peers'
below, labelled by rank, each peer's window shifted by the job's clock alignment. The screenshot is kept
as test-artifacts/browser/job-peers.png."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from store.store import Store
from tests.job_trace import JobSpec
from tests.test_browser import browser, free_port, page, screenshot  # noqa: F401 (fixtures)
from tests.test_job import _store
from tracehouse.cli.serve import create_server
from tracehouse.cli.up import start_ui, stop_process
from tracehouse.model import DEFAULT_LIMITS

JOB = "browser-job"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
# the heat map cell's centre on the screen, from plotly's own axes
CELL = """([step, rank]) => {
  const gd = document.querySelector('.js-plotly-plot'), x = gd._fullLayout.xaxis, y = gd._fullLayout.yaxis;
  const box = gd.getBoundingClientRect();
  return [box.left + x._offset + x.l2p(step), box.top + y._offset + y.l2p(rank)];
}"""
# every bar drawn (plotly's data as it decoded it): its lane, its event's name, where it starts and ends
BARS = """() => document.querySelector('.js-plotly-plot')._fullData.filter(t => t.type === 'bar').flatMap(t =>
  Array.from(t.y, (lane, i) => [lane, String(t.customdata[i][0]), Number(t.base[i]),
                                Number(t.base[i]) + Number(t.x[i])]))"""

TICKS = """() => [...document.querySelectorAll('.js-plotly-plot .ytick text')]
  .map(e => [e.getBoundingClientRect().top, e.textContent])"""


@pytest.fixture(scope="module")
def explorer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('browser-job') / 'store'}", DEFAULT_LIMITS)
    server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
    try:
        _store(f"127.0.0.1:{server.port}", JobSpec(job=JOB))
        port = free_port()
        process = start_ui(f"127.0.0.1:{server.port}", port)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_process(process)
    finally:
        server.stop(grace=5)
        store.close()


def wait_for_chart(page: Any) -> None:  # noqa: F811 (the fixture's name)
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(800)
    assert page.locator("[data-testid='stException']").count() == 0


def test_a_click_on_the_straggler_opens_its_timeline_with_its_peers_below(
    explorer: str,
    page: Any,  # noqa: F811 (the fixture)
) -> None:
    page.goto(f"{explorer}/job?job={JOB}")
    wait_for_chart(page)
    link = page.get_by_text("Rank 5's timeline at step 12, its peers below")
    deadline = time.monotonic() + 60
    while not link.count() and time.monotonic() < deadline:  # the click reruns the page with the point
        x, y = page.evaluate(CELL, [12, 5])
        page.mouse.click(x, y)
        page.wait_for_timeout(2_000)
    assert link.count() == 1, "no link after a click on rank 5, step 12"
    link.click()
    page.wait_for_selector("text=on top, its peers below", timeout=60_000)
    wait_for_chart(page)
    params = parse_qs(urlparse(page.url).query)
    assert page.url.split("?")[0].endswith("/timeline")
    assert (params["run"], params["job"], params["step"], params["peers"]) == (
        [f"{JOB}-rank5"], [JOB], ["12"], ["0,1,2,3,4,6,7"])  # fmt: skip
    said = page.locator("[data-testid='stCaptionContainer']").all_inner_texts()
    assert any("Rank 5 at step 12 on top, its peers below (ranks 0, 1, 2, 3, 4, 6, 7)" in s for s in said), said
    clocks = page.locator("[data-testid='stTable']").inner_text()
    assert "collective ends: shifted +50 ms ± 1 µs" in clocks and "same host as rank 5: same clock" in clocks
    # the lanes as drawn, top to bottom: rank 5's, then each peer's, labelled by rank
    lanes = [text for _, text in sorted(page.evaluate(TICKS))]
    ranks = list(dict.fromkeys(int(label.split(" ")[1]) for label in lanes if label.startswith("rank ")))
    assert ranks == [5, 0, 1, 2, 3, 4, 6, 7], lanes
    assert "rank 0 · GPU 0 · stream 9" in lanes and "rank 5 · GPU 1 · stream 7" in lanes
    # node-0's peers shifted by 50 ms: every rank's all-reduce ends at one instant; rank 5 computes
    # 20 ms longer, its peers wait that much longer in the all-reduce
    bars = page.evaluate(BARS)
    ends = {int(lane.split(" ")[1]): end for lane, name, _, end in bars if name == ALLREDUCE}
    starts = {int(lane.split(" ")[1]): start for lane, name, start, _ in bars if name == ALLREDUCE}
    assert sorted(ends) == list(range(8))
    assert np.ptp(list(ends.values())) < 0.01
    waits = {rank: ends[rank] - starts[rank] for rank in ends}
    assert min(w for r, w in waits.items() if r != 5) > waits[5] + 15
    screenshot(page, "job-peers")
