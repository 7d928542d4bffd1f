"""The Runs and Compare pages under Streamlit's AppTest, against the real server: Compare opens
with the verdict (B slower or faster per step, and where the step time went), then its
one-sentence answer and a short table of key figures; both pages count a run's GPUs as
`compare` does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pandas as pd
import pytest
import streamlit as st

from query import verdict_text
from query.client import Client, QueryFailed
from query.headline import compare_headline, key_figures
from tests.helpers import MS, T0, S, request
from tests.test_ui import open_app
from tracehouse.batch import BatchBuilder
from tracehouse.bench.verdict_runs import RunShape, synthetic_run
from tracehouse.metrics import GPU_UTIL
from tracehouse.v1 import ingest_pb2_grpc
from ui.changes import absent_blank, offered, speed_word
from ui.data import plain

APP = str(Path(__file__).resolve().parents[1] / "ui" / "app.py")
HOST = "node-ui"
NO_STEPS = "No verdict per step: "


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_resource.clear()


@pytest.fixture
def scene(ingest: ingest_pb2_grpc.IngestStub) -> list[str]:
    """The host's agent (GPUs 0 and 1, utilisation sampled), two imports of GPU 0 (the later one
    registers it again) and a user's run that recorded no GPUs."""
    ticks = np.arange(T0, T0 + 40 * S, 100 * MS)
    agent = BatchBuilder("agent-ui", run_id="agent-ui", host=HOST)
    agent.add_run("agent-ui", name="agent", host=HOST, source="agent", start=T0, end=T0 + 40 * S, attrs={"gpus": "2"})
    for gpu in (0, 1):
        agent.add_device(HOST, gpu, uuid=f"GPU-{gpu}", name="sampled", run_id="agent-ui")
        agent.add_samples(GPU_UTIL, ticks, (ticks // S % 7 * 10 + gpu).astype(float), gpu=gpu)
    ingest.Write(request(agent), timeout=60)
    for number, (run_id, kernel_ms) in enumerate((("early", 900), ("late", 400))):
        start = T0 + (1 + 12 * number) * S
        batch = BatchBuilder(f"run-{run_id}", run_id=run_id, host=HOST)
        batch.add_run(run_id, name=f"run {run_id}", host=HOST, source="nsys", start=start,
                      end=start + (10 - 2 * number) * S, attrs={"gpus": "1"})  # fmt: skip
        batch.add_device(HOST, 0, uuid="GPU-0", name="traced", run_id=run_id)
        batch.add_events("kernel", [start + MS], [start + (1 + kernel_ms) * MS], "gemm", gpu=0, stream=7)
        batch.add_events("cuda_api", [start + MS], [start + 3 * S], "cudaDeviceSynchronize", gpu=-1)
        ingest.Write(request(batch), timeout=60)
    user = BatchBuilder("run-user", run_id="user-ui", host=HOST)
    user.add_run("user-ui", name="a user's run", host=HOST, start=T0 + 30 * S, end=T0 + 35 * S)
    ingest.Write(request(user), timeout=60)
    return ["agent-ui", "early", "late", "user-ui"]


def test_compare_opens_with_the_answer_and_the_key_figures(
    address: str, client: Client, scene: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(address, monkeypatch, "compare", a="early", b="late")
    runs, changes = client.compare(["early", "late"]), client.diff("early", "late")
    headline = compare_headline(runs, changes)
    assert headline == "run late is 20.0 % faster than run early (10 s → 8 s). Biggest change: gemm -500 ms (-55.6 %)."
    measures = client.verdict(["early"], ["late"])["measures"]
    boxes = [*app.success, *app.warning, *app.info]
    if measures.empty or (measures["verdict"] == "not measured").all():  # no verdict: the durations lead
        assert [s.value for s in boxes] == [plain(headline, 2000)] and not app.table, "one headline, green"
        assert any(c.value.startswith(NO_STEPS) for c in app.caption), [c.value for c in app.caption]
    else:  # the verdict leads, in the colour of its word; the durations follow as a figure, in no box
        assert [b.value for b in boxes] == [plain(verdict_text.headline(measures), 2000)], "one headline"
        assert f"**Whole runs**, start to end, set-up included: {plain(headline, 2000)}" in [
            m.value for m in app.markdown
        ]
    figures = app.dataframe[0].value
    pd.testing.assert_frame_equal(figures, key_figures(runs))
    assert list(figures.columns) == ["Figure", "A", "B", "Change"], "four short columns: no horizontal scroll"
    shown = figures.set_index("Figure")
    assert shown.loc["Duration"].tolist() == ["10 s", "8 s", "-2 s (-20.0 %)"]
    assert shown.loc["GPUs"].tolist() == ["1 (0)", "1 (0)", "="]
    assert not any(len(str(cell)) > 40 for cell in figures.to_numpy().ravel()), "short cells"
    assert "Every figure of both runs" in [e.label for e in app.expander], "the details below, folded"


def test_runs_page_counts_gpus_as_compare_does(
    address: str, client: Client, scene: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = open_app(address, monkeypatch, "")
    listed = app.dataframe[0].value.set_index("run")["gpus"].to_dict()
    compared = client.compare(scene).set_index("run_id")["gpus"].to_dict()
    assert listed == compared == {"agent-ui": 2, "early": 1, "late": 1, "user-ui": 2}


def test_compare_opens_with_the_verdict(
    address: str, client: Client, ingest: ingest_pb2_grpc.IngestStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's sgemm 5 % longer: the page says B is slower per step, in a warning, and names sgemm
    among the parts; the pages' other content follows as before."""
    before, _ = synthetic_run("before", 1, T0, RunShape())
    after, _ = synthetic_run("after", 2, T0 + 10 * S, RunShape(longer={"sgemm_128x64_nn": 0.05}))
    for batch in (before, after):
        ingest.Write(request(batch), timeout=60)
    app = open_app(address, monkeypatch, "compare", a="before", b="after")
    verdict = client.verdict(["before"], ["after"])
    said = verdict_text.headline(verdict["measures"])
    assert said.startswith("B is slower than A: step time +"), said
    assert [w.value for w in app.warning] == [plain(said, 2000)], "the verdict first, as a warning"
    assert not app.error
    measures, parts, phases, launched, steps = (t.value for t in app.table)
    assert list(launched.index) == ["compute", "GPU time"]
    pd.testing.assert_frame_equal(phases, verdict_text.parts_rows(verdict["phases"]).set_index("part"))
    assert {"data", "compute", "outside phases", "step time"} == set(phases.index)
    pd.testing.assert_frame_equal(measures, verdict_text.measures_rows(verdict["measures"]).set_index("measure"))
    assert measures.loc["step time", "verdict"] == "slower"
    assert parts.index[0] == "sgemm_128x64_nn" and parts.index[-1] == "step time", list(parts.index)
    assert list(parts.columns) == ["A per step", "B per step", "B - A", "95 % interval"]
    pd.testing.assert_frame_equal(parts, verdict_text.parts_rows(verdict["parts"]).set_index("part"))
    assert sorted(steps["run id"]) == ["after", "before"]
    assert [e.label for e in app.expander][:2] == ["The runs' steps (warm-up left out)", "Every figure of both runs"]
    assert not app.success and not app.info, "one headline: the verdict's, in the colour of its word"
    whole = [m.value for m in app.markdown if m.value.startswith("**Whole runs**")]
    assert len(whole) == 1 and "faster" not in whole[0], "the two runs' durations still follow, as a figure"
    pd.testing.assert_frame_equal(app.dataframe[0].value, key_figures(client.compare(["before", "after"])))


def test_a_failed_verdict_leaves_the_rest_of_the_page(
    address: str, scene: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **options: object) -> None:
        raise QueryFailed(grpc.StatusCode.INVALID_ARGUMENT, "too many steps")

    monkeypatch.setattr(Client, "verdict", refuse)
    app = open_app(address, monkeypatch, "compare", a="early", b="late")
    assert "No verdict per step for these runs. Refused: too many steps" in [c.value for c in app.caption]
    assert not app.warning and len(app.success) == 1, "the runs' durations are the one headline"
    assert "faster" in app.success[0].value and not app.error, "the page goes on"
    assert list(app.dataframe[0].value.columns) == ["Figure", "A", "B", "Change"]


def test_a_headline_is_coloured_by_what_it_says() -> None:
    """Issue 41: '59 % slower' was shown in a green box; the colour now follows the sentence's own word."""
    assert speed_word("run late is 59.0 % slower than run early (10 s → 15.9 s).") == "slower"
    assert speed_word("B is faster than A: step time -23.0 %, from 3 and 3 runs.") == "faster"
    assert speed_word("B vs A: too noisy to tell: GPU busy -99.9 %, from one run each side.") == ""


def test_a_kernel_one_run_never_ran_reads_blank_there() -> None:
    changes = pd.DataFrame({"name": ["only in B", "both"], "instances_a": pd.array([0, 3], dtype="uint64"),
                            "total_ns_a": [0, 30], "avg_ns_a": [float("nan"), 10.0],
                            "instances_b": pd.array([2, 3], dtype="uint64"), "total_ns_b": [40, 60],
                            "avg_ns_b": [20.0, 20.0], "delta_ns": [40, 30]})  # fmt: skip
    shown = absent_blank(changes)
    assert shown.loc[0, ["instances_a", "total_ns_a", "avg_ns_a"]].isna().all(), "absent, not 0 ns"
    assert shown.loc[1, "total_ns_a"] == 30 and shown.loc[0, "delta_ns"] == 40 and shown.loc[0, "total_ns_b"] == 40
    assert changes.loc[0, "total_ns_a"] == 0, "the answer itself (and its CSV) keeps the exact 0"


def test_the_verdicts_advice_is_a_button_not_a_flag() -> None:
    """A refusal's `--steps REGEX` / `--window DURATION` cannot be pasted into the explorer: it offers
    to do it, with the URL parameters the page reads back."""
    assert offered(["--steps", "^train_step$"]) == (
        "Compare with NVTX ranges matching ^train_step$ as steps",
        {"steps": "^train_step$"},
    )
    assert offered(["--window", "20ms"]) == ("Compare in windows of 20ms", {"window": "20ms"})
    assert offered([]) is None
