"""The explorer's pure parts: the view in the URL, window moves, lane labels, and what the figures say."""

from __future__ import annotations

import html

import pandas as pd
import pytest

from ui import figures
from ui.figures import _ordered_labels
from ui.view import LAST_NS, MIN_WIDTH_NS, RunBounds, View, ViewError, inside, pan, selected, zoom

NOW = 1_800_000_000_000_000_000
S = 1_000_000_000


def test_a_view_survives_the_url() -> None:
    for view in (
        View(),
        View(run="r1", start="now-5m", host="node-1", metrics=()),
        View(last="1h", metrics=("a", "b")),
    ):
        assert View.from_params(view.params()) == view
    assert View().params() == {}, "the defaults leave the URL clean"


def test_the_window_comes_from_typed_times_then_a_preset_then_the_run() -> None:
    run = RunBounds(NOW - 100 * S, NOW - 10 * S)
    assert View(start=str(NOW - 50 * S), end=str(NOW - 40 * S)).window(NOW, run) == (NOW - 50 * S, NOW - 40 * S)
    assert View(start="now-30s").window(NOW, run) == (NOW - 30 * S, NOW - 10 * S), "the run's end closes it"
    assert View(start="now-30s").window(NOW, None) == (NOW - 30 * S, NOW)
    assert View(last="5m").window(NOW, run) == (NOW - 300 * S, NOW)
    assert View(run="r").window(NOW, run) == (NOW - 100 * S, NOW - 10 * S)
    assert View(run="r").window(NOW, RunBounds(NOW - 100 * S, None)) == (NOW - 100 * S, NOW), "an open run: to now"
    assert View().window(NOW, None) == (NOW - 900 * S, NOW)


@pytest.mark.parametrize(
    ("view", "field"),
    [
        (View(start="yesterday"), "from"),
        (View(last="forever"), "last"),
        (View(start="now", end="now-1m"), "window"),
        (View(end="3000-01-01T00:00:00Z"), "to"),
        (View(start="99999999999999999999"), "from"),
        (View(start="1969-12-31T23:00:00Z"), "from"),
    ],
)
def test_a_window_that_does_not_parse_names_its_field(view: View, field: str) -> None:
    with pytest.raises(ViewError, match=field):
        view.window(NOW, None)


def test_moves_keep_the_window_inside_what_a_store_holds() -> None:
    assert zoom(10 * S, 20 * S, 2.0) == (5 * S, 25 * S)
    assert zoom(0, 10 * S, 2.0) == (0, 20 * S), "a relative-time run starts at 0: zooming out stays there"
    assert pan(0, 10 * S, -0.5) == (0, 10 * S)
    assert pan(LAST_NS - 10 * S, LAST_NS, 0.5) == (LAST_NS - 10 * S, LAST_NS)
    assert pan(10 * S, 20 * S, 0.5) == (15 * S, 25 * S)
    assert inside(5 * S, 5 * S) == (5 * S - MIN_WIDTH_NS // 2, 5 * S + MIN_WIDTH_NS // 2), "a microsecond at least"


def test_a_selection_becomes_a_window() -> None:
    assert selected(NOW, 2.5, 1.25) == (NOW + 1_250_000_000, NOW + 2_500_000_000)
    assert selected(NOW, 1.0, 1.0) == inside(NOW + S, NOW + S), "a click is not an empty window"


def test_every_lane_has_a_row_of_its_own() -> None:
    keys = pd.DataFrame(
        [
            ("gpu", "h", 0, 7, 0, 0, 0),
            ("sync", "h", 0, 7, 9, 9, 0),  # cudaStreamSynchronize
            ("sync", "h", 0, -1, 9, 9, 0),  # cudaDeviceSynchronize: same thread, no stream
            ("nvtx", "h", -1, -1, 9, 9, 1),
            ("nvtx", "h", -1, -1, 9, 9, 0),
            ("cuda_api", "h", -1, -1, 9, 9, 0),
        ],
        columns=["lane", "host", "gpu", "stream", "pid", "tid", "depth"],
    )
    order, labels = _ordered_labels(keys)
    assert len(set(order)) == len(order) == len(keys) and set(labels) == set(order)
    assert order[0] == "GPU 0 · stream 7" and order[1:3] == ["NVTX · pid 9 · tid 9", "NVTX · pid 9 · tid 9 · L1"]


# -- figures: what a person reads on them -------------------------------------------------------

CLOVER = "void clover::par_ranged2d_kernel<advec_mom_kernel(int, int, int, int, clover::Buffer2D<double> &, " + (
    "clover::Buffer2D<double> &, " * 6
)


def test_bars_never_put_two_names_on_one_bar() -> None:
    names = [f"{CLOVER})::[lambda(int, int) (instance {i})]>(clover::Range2d, T1)" for i in range(1, 13)]
    frame = pd.DataFrame({"name": [*names, "void PdV_kernel()"], "total_ns": [*range(13_000_000, 14_200_000, 100_000),
                                                                              19_404_589]})  # fmt: skip
    bar = figures.bars(frame, "name", "total_ns", "total time")
    [drawn] = bar.data
    assert [html.unescape(y) for y in drawn.y] == ["void PdV_kernel()", *names[::-1]], "a bar per full name"
    ticks = [html.unescape(text) for text in bar.layout.yaxis.ticktext]
    assert len(set(ticks)) == len(ticks) == len(names) + 1 and all(len(t) <= 60 for t in ticks)
    assert drawn.x[0] == pytest.approx(19.404589) and bar.layout.xaxis.title.text == "total time (ms)"
    assert drawn.customdata[0][1] == "19.4 ms" and "PdV_kernel" in drawn.customdata[0][0]


def test_bars_of_changes_read_as_signed_durations() -> None:
    frame = pd.DataFrame({"name": ["cudaDeviceSynchronize", "relu"], "delta_ns": [-4_800_000_000, 1_200_000]})
    [drawn] = figures.bars(frame, "name", "delta_ns", "Δ total time").data
    assert list(drawn.x) == pytest.approx([-4.8, 0.0012]) and drawn.customdata[0][1] == "-4.8 s"


def test_the_timeline_reads_in_units_and_keeps_ranges_apart_from_kinds() -> None:
    start = NOW
    series = pd.DataFrame(
        {"host": "h", "gpu": 0, "metric": "gpu.mem_used_bytes", "bucket_start": pd.to_datetime([start, start + S]),
         "min": [7.0e10, 7.1e10], "avg": [7.1e10, 7.2e10], "max": [7.2e10, 7.3e10], "count": [10, 10]}
    )  # fmt: skip
    kinds = ["kernel", "memcpy", "memset", "sync", "cuda_api", *[f"nvtx-{i}" for i in range(40)]]
    events = pd.DataFrame(
        {"kind": [k if not k.startswith("nvtx") else "nvtx" for k in kinds], "name": kinds, "host": "h",
         "start": start, "end": start + 10_000, "gpu": 0, "stream": 7, "pid": 1, "tid": 1, "depth": 0,
         "correlation_id": 0}
    )  # fmt: skip
    figure = figures.timeline(figures.Window(start, start + 2 * S), series, ["gpu.mem_used_bytes"], events=events)
    assert figure.layout.yaxis.title.text == "gpu.mem_used_bytes (GiB)"
    [line] = [t for t in figure.data if t.type == "scatter"]
    assert list(line.y) == pytest.approx([7.1e10 / 2**30, 7.2e10 / 2**30])
    assert line.customdata[1][1] == "67.1 GiB" and line.customdata[1][0] == "+1.000000 s"
    assert figure.layout.xaxis2.title.text == "time from 2027-01-15 08:00:00.000 UTC (s)"  # under the lanes
    bars = {t.name: t for t in figure.data if t.type == "bar"}
    kind_colors = {str(bars[k].marker.color) for k in ("kernel", "memcpy", "memset", "sync", "cuda_api")}
    range_colors = set(bars["nvtx"].marker.color)
    assert len(range_colors) > 1 and not range_colors & (kind_colors | set(figures.PALETTE))
    assert bars["nvtx"].marker.pattern.shape == "/" and not bars["kernel"].marker.pattern.shape


def test_the_busy_cells_have_a_legend_and_a_narrow_window_reads_in_microseconds() -> None:
    lanes = pd.DataFrame(
        {"lane": "gpu", "host": "h", "gpu": 0, "stream": 7, "pid": 0, "tid": 0, "depth": 0,
         "bucket_start_ns": [NOW, NOW + 1_000], "busy_ns": [500, 1_000], "events": [3, 1], "top_name": ["k", "k"]}
    )  # fmt: skip
    lanes.attrs.update(bucket_ns=1_000, start_ns=NOW)
    window = figures.Window(NOW, NOW + 2_000)
    figure = figures.timeline(window, pd.DataFrame(columns=["metric"]), [], lanes=lanes)
    [cells] = figure.data
    assert cells.showscale is not False and cells.colorbar.title.text == "share of bucket busy, %"
    assert figure.layout.xaxis.title.text.endswith("(µs)") and window.unit_ns == 1_000
    assert selected(NOW, 0.5, 1.5, window.unit_ns) == (NOW + 500, NOW + 1_500)
