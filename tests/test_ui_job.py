"""The Job page's heat map opening a rank's timeline with its peers' lanes below it, under Streamlit's
AppTest against the real server and chDB store, on a synthetic job with a known truth (tests/job_trace.py):
8 ranks on two hosts whose clocks are 50 ms apart, rank 5 computing 20 ms longer in steps 10 to 19."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from tests.job_trace import COMPUTE_NS, MS, JobSpec
from tests.test_job import _store
from tests.test_ui import figure_of, fresh_caches, open_app, param, texts  # noqa: F401 (fresh_caches: autouse)
from ui.peers import default_peers, members, parse_peers
from ui.view import ViewError

ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def click(app: AppTest, rank: int, step: int) -> dict[str, str]:
    """A click on the heat map's cell (as Streamlit hands the page a selected point), and the link it gives."""
    app.session_state["heat"] = {"selection": {"points": [{"x": step, "y": rank}], "point_indices": [], "box": [],
                                               "lasso": []}}  # fmt: skip
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    links = [e.proto for e in app.main if e.type == "page_link"]
    assert len(links) == 1
    assert links[0].page == "timeline" and f"Rank {rank}'s timeline at step {step}" in links[0].label
    return dict(parse_qsl(links[0].query_string))


def open_timeline(app: AppTest, params: dict[str, str]) -> AppTest:
    app.switch_page("pages/timeline.py")
    for key in list(app.query_params):
        del app.query_params[key]
    app.query_params.update(params)
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def slices(app: AppTest) -> pd.DataFrame:
    """Every event drawn: its lane's label, kind, and where it starts and ends on the time axis (ms)."""
    rows: list[dict[str, Any]] = []
    for trace in figure_of(app)["data"]:
        if trace.get("type") != "bar":
            continue
        base, length = np.asarray(trace["base"], float), np.asarray(trace["x"], float)
        names = [str(c[0]) for c in trace["customdata"]]
        for y, b, n, name in zip(trace["y"], base, length, names, strict=True):
            rows.append({"lane": y, "kind": trace["name"], "name": name, "start": b, "end": b + n})
    frame = pd.DataFrame(rows)
    frame["rank"] = frame["lane"].str.extract(r"^rank (\d+) · ")[0].astype(int)
    return frame


def test_a_cell_opens_the_ranks_timeline_with_its_peers_below_on_its_clock(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(address, JobSpec(job="peers"))
    app = open_app(address, monkeypatch, "job", job="peers")
    link = click(app, 5, 12)
    assert (link["run"], link["job"], link["step"], link["peers"]) == ("peers-rank5", "peers", "12", "0,1,2,3,4,6,7")
    open_timeline(app, link)
    drawn = slices(app)
    # the rank's lanes on top, then each peer's, labelled with its rank
    order = list(dict.fromkeys(figure_of(app)["layout"]["yaxis"]["categoryarray"][::-1]))
    assert [int(label.split(" ")[1]) for label in order[:3]] == [5, 5, 5]
    assert list(dict.fromkeys(int(label.split(" ")[1]) for label in order)) == [5, 0, 1, 2, 3, 4, 6, 7]
    assert "rank 0 · GPU 0 · stream 9" in order
    assert len(figure_of(app)["layout"]["shapes"]) == 4  # every other rank's lanes on a band: 0, 2, 4 and 7
    # every rank's all-reduce ends at one instant once each peer's window is shifted by its offset (node-0's
    # clock runs 50 ms behind node-1's): without the shift node-0's would end 50 ms apart from node-1's
    ends = drawn[drawn["name"] == ALLREDUCE].groupby("rank")["end"].max()
    assert sorted(ends.index) == list(range(8))
    assert np.ptp(ends.to_numpy()) < 0.01  # ms: the noise of the synthetic ends is none, the alignment 1 µs
    # the straggler's compute reads directly above its peers' waiting in the all-reduce
    compute = drawn[drawn["name"].str.startswith("gemm_")].groupby("rank")["end"].max()
    waiting = drawn[drawn["name"] == ALLREDUCE].groupby("rank").apply(lambda f: f["end"].max() - f["start"].min())
    assert compute[5] > compute.drop(5).max() + 15  # 20 ms longer
    assert waiting.drop(5).min() > waiting[5] + 15
    assert compute.drop(5).max() < (COMPUTE_NS + 10 * MS) / MS  # peers' compute ends inside the window
    said = texts(app.caption)
    assert "Rank 5 at step 12 on top, its peers below (ranks 0, 1, 2, 3, 4, 6, 7)" in said
    clocks = app.table[0].value.set_index("rank")
    assert clocks.loc[0, "clock"] == "collective ends: shifted +50 ms ± 1 µs"
    assert clocks.loc[4, "clock"] == "same host as rank 5: same clock"
    assert clocks.loc[5, "clock"] == "this rank: same clock"


def test_peers_are_chosen_on_the_page_and_kept_in_the_url(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(address, JobSpec(job="pick"))
    app = open_app(address, monkeypatch, "job", job="pick")
    open_timeline(app, click(app, 5, 12))
    app.multiselect[-1].set_value([4, 0]).run()
    assert not app.exception
    assert param(app, "peers") == "0,4" and param(app, "job") == "pick" and param(app, "run") == "pick-rank5"
    assert sorted(slices(app)["rank"].unique()) == [0, 4, 5]
    app.multiselect[-1].set_value([]).run()
    assert param(app, "peers") == "none"
    assert set(slices(app)["rank"]) == {5}
    # the URL alone reopens the same view, peers included
    again = open_app(address, monkeypatch, "timeline", **{k: param(app, k) for k in ("run", "from", "to", "job")},
                     peers="3")  # fmt: skip
    assert set(slices(again)["rank"]) == {5, 3}
    assert "zoom out" in [b.label for b in again.button]
    next(b for b in again.button if b.label == "zoom out").click().run()
    assert param(again, "peers") == "3" and param(again, "job") == "pick"  # moving keeps the peers
    next(b for b in again.button if b.label == "whole run").click().run()
    assert not again.exception and param(again, "peers") == "3" and not param_or_none(again, "from")
    whole = slices(again)  # the whole run of both: all 40 all-reduces each, ending together step by step
    ends = {rank: np.sort(part["end"].to_numpy()) for rank, part in whole[whole["name"] == ALLREDUCE].groupby("rank")}
    assert sorted(ends) == [3, 5] and len(ends[3]) == len(ends[5]) == 40
    assert np.abs(ends[3] - ends[5]).max() < 1e-5 * ends[5].max()  # node-1's 50 ms is some 1 % of the run


def param_or_none(app: AppTest, key: str) -> str | None:
    return param(app, key) if key in app.query_params else None


def test_a_bad_peers_parameter_is_said_and_the_default_drawn(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(address, JobSpec(job="bad", ranks=4, slow_rank=None, host_offsets_ns={}))
    app = open_app(address, monkeypatch, "job", job="bad")
    link = click(app, 1, 3)
    open_timeline(app, {**link, "peers": "1,x"})
    assert "peers: '1,x' is not a list of ranks" in texts(app.error)
    assert set(slices(app)["rank"]) == {0, 1, 2, 3}


def test_a_big_job_shows_the_nearest_in_step_time_and_the_median_rank() -> None:
    alignment = ["reference"] + ["same host"] * 3 + ["agent offsets"] * 4 + ["none"] * 4
    ranks = pd.DataFrame({"rank": range(12), "run_id": [f"r{i}" for i in range(12)],
                          "host": [f"h{i // 4}" for i in range(12)], "offset_ns": [0] * 4 + [7] * 4 + [-3] * 4,
                          "uncertainty_ns": [0] * 4 + [2] * 4 + [-1] * 4, "alignment": alignment})  # fmt: skip
    placed, unaligned = members(ranks, 5)
    assert unaligned == [8, 9, 10, 11]  # said, never guessed
    assert placed[0].shift_ns == -7 and placed[0].uncertainty_ns == 2 and placed[0].alignment == "agent offsets"
    assert placed[0].window(100, 200) == (107, 207)
    assert placed[6].shift_ns == 0 and placed[6].alignment == "same host as rank 5"
    times = {r: 100 + r for r in range(12)}
    times[5] = 500  # the straggler: its nearest are the slowest of the rest, and the median rank
    chosen = default_peers(5, list(range(12)), times)
    assert chosen == [6, 10, 11]  # 10 and 11 nearest 500; the median of 12 ranks (lower) is rank 6
    assert default_peers(5, list(range(12)), {}) == [4, 6]  # no step times: its neighbours
    assert default_peers(2, list(range(8)), {}) == [0, 1, 3, 4, 5, 6, 7]  # a small job: all of it
    assert parse_peers("", [1, 2]) is None and parse_peers("none", [1, 2]) == []
    with pytest.raises(ViewError, match="peers: rank\\(s\\) 9 are not ranks of this job"):
        parse_peers("1,9", [1, 2])


def test_a_long_window_draws_each_ranks_busy_lanes_on_its_clock(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(address, JobSpec(job="long", ranks=2, per_host=1, steps=300, slow_rank=None))
    app = open_app(address, monkeypatch, "timeline", run="long-rank1", job="long", peers="0")
    busy = figure_of(app)["data"][-1]  # too many events to draw one by one: busy cells per lane and rank
    assert busy["type"] == "heatmap"
    rows = {label: i for i, label in enumerate(busy["y"])}
    assert set(rows) >= {"rank 1 · GPU 0 · stream 9", "rank 0 · GPU 0 · stream 9"}
    shade = np.nan_to_num(np.asarray(busy["z"], float))
    mine, peer = shade[rows["rank 1 · GPU 0 · stream 9"]], shade[rows["rank 0 · GPU 0 · stream 9"]]
    assert mine.sum() > 0
    # rank 0's clock runs 50 ms behind rank 1's: shifted, its all-reduces fill the same buckets as rank 1's
    assert np.abs(mine - peer).sum() < 0.1 * mine.sum()


def test_ranks_whose_clock_cannot_be_aligned_are_said_not_drawn(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(address, JobSpec(job="apart", slow_rank=None, no_trace=(4, 5, 6, 7)))  # node-1: nothing to align by
    app = open_app(address, monkeypatch, "timeline", run="apart-rank0", job="apart")
    assert set(slices(app)["rank"]) == {0, 1, 2, 3}
    assert "Left out, their clocks not aligned with the job's: rank(s) 4, 5, 6, 7." in texts(app.caption)
    alone = open_app(address, monkeypatch, "timeline", run="apart-rank4", job="apart")
    assert "Rank 4's clock could not be aligned with the job's" in texts(alone.warning)
