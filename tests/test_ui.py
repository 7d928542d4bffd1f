"""Each page of the explorer under Streamlit's AppTest, against the real server with two
stored runs: what it shows is checked against the Query client's own answers."""

from __future__ import annotations

import base64
import html
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from query.client import Client
from tests.helpers import request
from tests.timeline_trace import MS, T0, Trace
from tracehouse import units
from tracehouse.batch import BatchBuilder
from tracehouse.config import ENV_SERVER
from tracehouse.readable import headers
from tracehouse.v1 import ingest_pb2_grpc
from ui.tables import FOR_PROGRAMS

APP = str(Path(__file__).resolve().parents[1] / "ui" / "app.py")


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_resource.clear()


def open_app(server: str, monkeypatch: pytest.MonkeyPatch, page: str = "", **params: str) -> AppTest:
    monkeypatch.setenv(ENV_SERVER, server)
    app = AppTest.from_file(APP, default_timeout=60)
    app.run()
    if page:
        app.switch_page(f"pages/{page}.py")
        app.query_params.update(params)
        app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def decoded(value: Any) -> Any:
    """Plotly's JSON with its typed arrays ({"dtype", "bdata"}) as plain lists."""
    if isinstance(value, dict):
        if set(value) >= {"dtype", "bdata"}:
            array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
            shape = [int(n) for n in str(value.get("shape", len(array))).split(",")]
            return array.reshape(shape)
        return {k: decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decoded(v) for v in value]
    return value


def figure_of(app: AppTest, index: int = 0) -> dict[str, Any]:
    return decoded(json.loads(app.get("plotly_chart")[index].proto.spec))


def param(app: AppTest, key: str) -> str:
    value = app.query_params[key]
    return str(value[0] if isinstance(value, list) else value)


def texts(elements: Any) -> str:
    return "\n".join(str(e.value) for e in elements)


def shown(table: Any) -> pd.DataFrame:
    """A table's cells as the page shows them (the Styler's display values)."""
    return pa.ipc.open_stream(table.proto.arrow_data.styler.display_values).read_pandas()


def assert_answer(table: Any, answer: pd.DataFrame) -> None:
    """The table holds the answer's exact values under headers for people (less the flags for programs)."""
    answer = answer.drop(columns=[c for c in FOR_PROGRAMS if c in answer.columns])
    pd.testing.assert_frame_equal(table.value, answer.rename(columns=headers(answer)))


# -- runs ---------------------------------------------------------------------------------------


def test_runs_page_lists_filters_and_opens_runs(
    address: str, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(address, monkeypatch)
    assert texts(app.title) == "Runs"
    listed = app.dataframe[0].value
    assert set(listed["run"]) == {"r1", "r2"}
    assert listed.set_index("run").loc["r1", "duration"] == pytest.approx((traces["r1"].end - traces["r1"].start) / 1e9)
    app.text_input[0].input("r2").run()
    assert list(app.dataframe[0].value["run"]) == ["r2"]
    app.multiselect[0].select("r2").run()
    [open_timeline] = [b for b in app.button if b.label == "Open timeline"]
    open_timeline.click().run()
    assert texts(app.title) == "Timeline" and param(app, "run") == "r2"
    assert app.get("plotly_chart"), "the timeline of the chosen run"


def test_runs_page_compares_two_runs(address: str, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch) -> None:
    app = open_app(address, monkeypatch)
    app.multiselect[0].select("r1").select("r2").run()
    [compare] = [b for b in app.button if b.label == "Compare"]
    compare.click().run()
    assert texts(app.title) == "Compare"
    assert not app.dataframe[0].value.empty


def test_an_empty_store_says_how_to_get_data_in(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEHOUSE_COMMAND", "uv run tracehouse")  # how `up` and `ui` were started: hints say the same
    for page in ("", "timeline", "kernels", "compare"):
        app = open_app(address, monkeypatch, page)
        assert "The store is empty" in texts(app.info) and "`uv run tracehouse import" in texts(app.info), page


def test_an_unreachable_server_says_what_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for page in ("", "timeline", "sql"):
        app = open_app(f"127.0.0.1:{port}", monkeypatch, page)
        assert "Cannot reach the tracehouse server" in texts(app.error) and "tracehouse up" in texts(app.error), page
        assert not app.get("plotly_chart")


# -- timeline -----------------------------------------------------------------------------------


def test_timeline_draws_downsampled_series_and_busy_lanes(
    address: str, client: Client, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(address, monkeypatch, "timeline", run="r1", metrics="gpu.util_pct,gpu.power_w")
    figure = figure_of(app)
    lines = {(t["name"], t["yaxis"]): t for t in figure["data"] if t["type"] in ("scatter", "scattergl")}
    expected = client.series(["gpu.util_pct", "gpu.power_w"], max_points=1500, run="r1")
    assert len(lines) == 4  # two metrics, two GPUs
    for (metric, gpu), part in expected.groupby(["metric", "gpu"]):
        axis = "y" if metric == "gpu.util_pct" else "y2"
        line = lines[(f"node-1 GPU {gpu}", axis)]
        assert 0 < len(line["y"]) <= 1500
        assert np.allclose(line["y"], part["avg"].to_numpy())
    [cells] = [t for t in figure["data"] if t["type"] == "heatmap"]
    assert {"GPU 0 · stream 7", "GPU 1 · stream 13", "NVTX · pid 100 · tid 100"} <= set(cells["y"])
    assert "too many to tell apart" in texts(app.caption)


def test_timeline_draws_events_one_by_one_when_zoomed_in(
    address: str, client: Client, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    forward = next(r for r in traces["r1"].ranges if r["name"] == "forward" and r["tid"] == 100)
    start, end = forward["start"], forward["end"]
    app = open_app(address, monkeypatch, "timeline", run="r1", **{"from": str(start), "to": str(end)})
    figure = figure_of(app)
    bars = [t for t in figure["data"] if t["type"] == "bar"]
    drawn = sorted(name for t in bars for name in (row[0] for row in t["customdata"]))
    kinds = ["kernel", "memcpy", "memset", "cuda_api", "nvtx", "sync"]
    expected = client.events(kinds=kinds, run="r1", start=start, end=end)
    assert drawn == sorted(expected["name"])
    assert "forward" in drawn and any(name.startswith("kernel_") for name in drawn)


def test_timeline_zoom_out_and_pan_rewrite_the_window_in_the_url(
    address: str, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    start = traces["r1"].start + 10 * MS
    app = open_app(address, monkeypatch, "timeline", run="r1", **{"from": str(start), "to": str(start + 4 * MS)})
    [zoom_out] = [b for b in app.button if b.label == "zoom out"]
    zoom_out.click().run()
    assert (int(param(app, "from")), int(param(app, "to"))) == (start - 2 * MS, start + 6 * MS)
    [later] = [b for b in app.button if b.label == "later ▶"]
    later.click().run()
    assert (int(param(app, "from")), int(param(app, "to"))) == (start + 2 * MS, start + 10 * MS)


def test_timeline_says_what_is_wrong_with_its_window(
    address: str, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(address, monkeypatch, "timeline", **{"from": "yesterday-ish"})
    assert "does not parse" in texts(app.error) and "from" in texts(app.error)
    app = open_app(address, monkeypatch, "timeline", **{"from": "1000", "to": "2000"})
    assert "Nothing in this window" in texts(app.info)
    app = open_app(address, monkeypatch, "timeline", run="no-such-run")
    assert "not in the store" in texts(app.warning)


# -- kernels & phases ---------------------------------------------------------------------------


def test_kernels_and_phases_answer_for_the_window(
    address: str, client: Client, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(address, monkeypatch, "kernels", run="r1")
    assert "No CUDA API calls in this window" in texts(app.info)  # the trace has none
    frames = [d.value for d in app.dataframe]
    _, _, _, gpus, gaps, phases, projected = frames
    assert_answer(app.dataframe[1], client.summary("memops", run="r1"))
    assert len(gaps) == len(client.gpu_time(run="r1")["gaps"]) > 0  # over 1 ms
    app.select_slider[0].set_value(10_000).run()
    expected_gaps = client.gpu_time(min_gap_ns=10_000, run="r1")["gaps"]
    assert len(expected_gaps) > 20
    listed = app.dataframe[4].value
    assert list(listed["length"]) == sorted(expected_gaps["length_ns"], reverse=True)[:20], "the 20 longest"
    assert f"first 20 of {len(expected_gaps)} idle gaps longer than 10 µs" in texts(app.caption)
    kernels = client.summary("kernels", run="r1")
    assert_answer(app.dataframe[0], kernels)
    assert list(shown(app.dataframe[0])["total"]) == [units.duration(ns) for ns in kernels["total_ns"]]
    assert list(shown(app.dataframe[0])["time %"]) == [units.percent(p) for p in kernels["time_pct"]]
    assert_answer(app.dataframe[2], client.summary("nvtx", run="r1"))
    start = traces["r1"].start
    longest = expected_gaps.sort_values("length_ns", ascending=False).head(20)
    # epoch ns are past 2**53, which the grid draws raw: the table holds exact offsets from the window's start
    assert list(listed["start"]) == [ns - start for ns in longest["start_ns"]]
    assert list(shown(app.dataframe[4])["start"]) == [units.offset(ns - start) for ns in longest["start_ns"]]
    assert units.instant(start) in texts(app.caption), "the one absolute time the offsets count from"
    chart = figure_of(app)["data"][0]
    assert [row[1] for row in chart["customdata"]] == [units.duration(ns) for ns in kernels["total_ns"]]
    scale, unit = units.axis_scale("ns", kernels["total_ns"].max())
    assert unit != "ns" and np.allclose(chart["x"], kernels["total_ns"] / scale), "one unit, by magnitude"
    assert figure_of(app)["layout"]["xaxis"]["title"]["text"] == f"Kernels: total time ({unit})"
    assert set(gpus["GPU"]) == {0, 1}
    assert set(phases["name"]) == {"step", "forward", "backward", "idle", "allreduce", "async io", "edge", "tail"}
    assert set(projected["name"]) == set(phases["name"])
    assert len(app.get("download_button")) == len(frames)


# -- compare ------------------------------------------------------------------------------------


def test_compare_shows_the_biggest_changes_first(
    address: str, client: Client, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(address, monkeypatch, "compare", a="r1", b="r2")
    said = " ".join(texts(found) for found in (app.success, app.warning, app.info, app.markdown))
    assert re.search(r"\b(faster|slower)\b", said), "the answer, in a sentence"
    assert len(app.success) + len(app.warning) + len(app.info) == 1, "one headline"
    changes = client.diff("r1", "r2")
    listed = app.dataframe[1].value
    assert list(listed["name"]) == list(changes["name"]) and list(listed["Δ"]) == list(changes["delta_ns"])
    assert list(shown(app.dataframe[1])["Δ"]) == [units.duration(ns) for ns in changes["delta_ns"]]
    app.multiselect[0].unselect("api").unselect("memops").run()
    assert set(app.dataframe[1].value["category"]) == {"kernels"}
    app = open_app(address, monkeypatch, "compare", a="r1", b="r1")
    assert "two different runs" in texts(app.info)


# -- sql ----------------------------------------------------------------------------------------


def test_sql_console_runs_read_only_queries(
    address: str, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(address, monkeypatch, "sql")
    schema = pd.concat([d.value for d in app.dataframe[1:]])  # beside the answer
    assert {"start", "end", "kind", "metric", "value"} <= set(schema["column"])
    answer = app.dataframe[0].value
    assert set(answer["name"]) == {w["name"] for w in traces["r1"].work + traces["r2"].work if w["kind"] == "kernel"}
    assert list(shown(app.dataframe[0])["total"]) == [units.duration(ns) for ns in answer["total"]]
    _, unit = units.axis_scale("ns", answer["total"].max())
    assert figure_of(app)["layout"]["yaxis"]["title"]["text"] == f"total ({unit})", "the header's words, not total_ns"
    app.text_area[0].input("SELECT number FROM numbers(50)")
    app.number_input[0].set_value(10)
    [run] = [b for b in app.button if b.label == "Run"]
    run.click().run()
    assert list(app.dataframe[0].value["number"]) == list(range(10)) and "cut off" in texts(app.caption)
    app.text_area[0].input("DROP TABLE events")
    [run] = [b for b in app.button if b.label == "Run"]
    run.click().run()
    assert texts(app.error).startswith("Refused: ") and "could not answer" not in texts(app.error)
    assert not app.exception


def test_strings_from_outside_are_shown_as_text(
    address: str, ingest: ingest_pb2_grpc.IngestStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = "<img src=x onerror=alert(1)> *bold* [link](javascript:alert(2))"
    builder = BatchBuilder("evil-b", run_id="evil", host="node-1")
    builder.add_run("evil", host="node-1", source="nsys", start=T0, end=T0 + MS)
    builder.add_events("kernel", [T0 + 10], [T0 + 500], hostile, gpu=0, stream=7, pid=1, tid=1)
    assert not ingest.Write(request(builder), timeout=30).duplicate
    app = open_app(address, monkeypatch, "timeline", run="evil")
    [bar] = [t for t in figure_of(app)["data"] if t["type"] == "bar"]
    assert bar["customdata"][0][0] == html.escape(hostile)  # plotly reads tags in text; escaped, they are text
    app = open_app(address, monkeypatch, "timeline", run=hostile)
    warning = texts(app.warning)
    assert "\\[link\\]\\(javascript" in warning and "\\<img" in warning  # markdown shows it as written


def test_timeline_asks_a_running_process_for_a_capture_and_shows_what_came_of_it(
    address: str, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_capture import Loop, steps_stored, wait_for

    loop = Loop(address, tmp_path, "ui-capture")
    try:
        wait_for(lambda: steps_stored(client, loop.run_id))
        app = open_app(address, monkeypatch, "timeline", run=loop.run_id)
        hint = f"capture --run {loop.run_id} --server {address}`"
        assert hint in texts(app.caption), "the command pastes as it is: the server named"
        [ask_button] = [b for b in app.button if b.label == "Capture the next 10 steps"]
        ask_button.click().run()
        assert not app.exception and "Asked (`cap-" in texts(app.success), texts(app.error)
        [asked] = client.capture_list(loop.run_id)
        wait_for(lambda: client.capture_state(asked["request_id"], loop.run_id)["state"] == "done")
        st.cache_data.clear()
        app.run()
        [table] = app.dataframe
        row = shown(table).iloc[0]
        assert row["outcome"] == "imported" and row["steps"] == f"{asked['first_step']} to {asked['first_step'] + 9}"
    finally:
        loop.stop()
    st.cache_data.clear()
    app.run()
    assert "has ended" in texts(app.caption) and not [b for b in app.button if b.label.startswith("Capture")]
    assert "capture --run" not in texts(app.caption), "no command for a run that cannot be captured"


def test_a_run_that_cannot_be_captured_gets_no_capture_command(
    address: str, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: the panel said the run cannot be captured, then offered `capture --run` (which failed)."""
    app = open_app(address, monkeypatch, "timeline", run="r1")
    said = texts(app.caption)
    assert "Only a running process" in said and "capture --run" not in said, said
