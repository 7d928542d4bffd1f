"""The explorer's pure parts: the view in the URL, window moves, lane labels, and what the figures say."""

from __future__ import annotations

import html

import pandas as pd
import pytest

from tracehouse.shortnames import unique_short_names
from ui import figures
from ui.controls import run_label
from ui.figures import _ordered_labels
from ui.tables import styled
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


def test_a_share_reads_on_a_whole_scale() -> None:
    """2.7 % busy fills 2.7 % of the chart, not all of it (issue 41): shares get a 0-100 % axis."""
    frame = pd.DataFrame({"gpu_name": ["vm GPU 0"], "busy_pct": [2.7]})
    bar = figures.bars(frame, "gpu_name", "busy_pct", "busy share per GPU")
    assert list(bar.layout.xaxis.range) == [0, 100] and bar.layout.xaxis.ticksuffix == " %"
    durations = figures.bars(pd.DataFrame({"name": ["k"], "total_ns": [5]}), "name", "total_ns", "total")
    assert durations.layout.xaxis.range is None, "sizes and durations stay autoscaled"


def test_slices_wide_enough_carry_their_short_name() -> None:
    """As Perfetto and Nsight draw them: a wide slice is labelled with the short name every table shows
    (cut with … to its room), a narrow one carries no text."""
    long = "void probe_group_by_GPU2<128, 4>(int*, int*, int*, int, short*)"
    events = pd.DataFrame(
        {"kind": "kernel", "name": [long, long, "tiny"], "host": "h", "start": [NOW, NOW + S, NOW + 2 * S],
         "end": [NOW + S, NOW + S + S // 8, NOW + 2 * S + 1_000], "gpu": 0, "stream": 7, "pid": 0, "tid": 0,
         "depth": 0, "correlation_id": 0}
    )  # fmt: skip
    figure = figures.timeline(figures.Window(NOW, NOW + 3 * S), pd.DataFrame(columns=["metric"]), [], events=events)
    [kernels] = figure.data
    wide, narrow, tiny = (html.unescape(text) for text in kernels.text)
    assert wide == "probe_group_by_GPU2<128, 4>(…)" == unique_short_names([long])[long]
    assert narrow == "probe…", "about 45 px: the same short name, cut at its end"
    assert tiny == "" and kernels.textposition == "inside" and figure.layout.uniformtext.mode == "hide"
    assert html.unescape(kernels.customdata[0][0]) == long, "the hover has the name whole"


def test_a_run_without_a_wall_clock_reads_as_offsets() -> None:
    """Issue 41: a trace that counts from its own start shows `+3.362 s`, never 1970."""
    window = figures.Window(3_362_000_000, 9_912_000_000, relative=True)
    assert window.axis_title == "time from the run's start +3.362 s (s)"
    assert figures.Window(S, 5 * S, relative=True, origin_ns=S).axis_title == "time from the run's start (s)"
    assert figures.moment(3_362_000_000, True) == "+3.362 s" == figures.moment(4_362_000_000, True, S)
    runs = pd.DataFrame({"run_id": ["old", "new"], "name": ["report1", "resnet"], "host": "h", "source": "nsys",
                         "start": pd.to_datetime([3_362_000_000, NOW], utc=True),
                         "relative_time": [True, False]})  # fmt: skip
    labels = run_label(runs)
    assert labels["old"] == "report1 · h · nsys · no wall clock" and "1970" not in labels["old"]
    assert labels["new"].endswith("2027-01-15 08:00:00")


def test_a_count_per_run_reads_with_thousands_separators() -> None:
    styler = styled(pd.DataFrame({"name": ["k"], "instances_a": pd.array([4350], dtype="uint64"),
                                  "instances_b": pd.array([1_234_567], dtype="uint64")}))  # fmt: skip
    html_text = styler.to_html()
    assert "4,350" in html_text and "1,234,567" in html_text


def test_the_sql_chart_names_its_axis_in_words() -> None:
    frame = pd.DataFrame({"name": ["a", "b"], "total_ns": [2 * S, 3 * S]})
    figure = figures.xy(frame, "name", "total_ns")
    assert figure.layout.yaxis.title.text == "total (s)" and figure.layout.xaxis.title.text == "name"


def test_a_slice_reads_as_the_runs_kernels_table_names_it() -> None:
    """Two kernels of a run that share a short form are told apart in its Kernels table: a slice of one
    of them, zoomed in alone, is labelled as the table labels it, not by the names in view."""
    one, other = "void k(int, float*)", "void k(double, float*)"
    events = pd.DataFrame(
        {"kind": "kernel", "name": [one], "host": "h", "start": [NOW], "end": [NOW + S], "gpu": 0, "stream": 7,
         "pid": 0, "tid": 0, "depth": 0, "correlation_id": 0}
    )  # fmt: skip
    window, none = figures.Window(NOW, NOW + 2 * S), pd.DataFrame(columns=["metric"])
    [alone] = figures.timeline(window, none, [], events=events).data
    [known] = figures.timeline(window, none, [], events=events, known_names=[one, other]).data
    table = unique_short_names([one, other])[one]
    assert html.unescape(known.text[0]) == table != html.unescape(alone.text[0]), (table, alone.text[0])


def test_a_table_for_people_leaves_out_the_flag_for_programs() -> None:
    shown = styled(pd.DataFrame({"name": ["k…"], "name_cut": [True], "total_ns": [5]})).data
    assert list(shown.columns) == ["name", "total"], "a cut name reads with its … alone, as the CLI's tables"
