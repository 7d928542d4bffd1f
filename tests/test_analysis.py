"""The analyses, checked against answers computed independently in plain Python over the same
synthetic events: overlapping kernels on several streams and GPUs, nested NVTX ranges, ranges
with no GPU work, work crossing the window's borders."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from query import analysis
from query.client import Client, QueryFailed, to_frame
from query.keeper import Keeper, keep_runs
from query.kept import KEPT_TABLES, WHAT_IS_KEPT, kept_runs
from query.window import Predicates
from store.store import Store, without_materialized_cte
from tests.conftest import FIXTURES
from tests.timeline_trace import HOST, MS, PID, US, Trace, make_trace, store_trace
from tracehouse.batch import BatchBuilder
from tracehouse.cli.main import main
from tracehouse.v1 import ingest_pb2, ingest_pb2_grpc

# -- the oracle ---------------------------------------------------------------------------------


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def islands_by_gpu(trace: Trace, lo: int | None = None, hi: int | None = None) -> dict[int, list[tuple[int, int]]]:
    by_gpu: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for w in trace.work:
        s, e = w["start"], w["end"]
        if (hi is not None and s >= hi) or (lo is not None and e <= lo):
            continue
        by_gpu[w["gpu"]].append((max(s, lo) if lo is not None else s, min(e, hi) if hi is not None else e))
    return {gpu: merge(intervals) for gpu, intervals in by_gpu.items()}


def overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


# -- gpu-time -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kept", [False, True], ids=["made at the question", "kept islands"])
@pytest.mark.parametrize("window", ["run", "crossing borders", "range instance"])
def test_gpu_time_matches_the_union_of_intervals(
    store: Store, client: Client, traces: dict[str, Trace], window: str, kept: bool
) -> None:
    trace = traces["r1"]
    if kept:
        keep_runs(store)
        assert _kept(store, "r1")
    if window == "run":
        lo, hi, args = trace.start, trace.end, {"run": "r1"}
        if kept:  # the run's every island is in the window: it is read a row per GPU and the gaps asked for
            first, last = _kept_span(store, "r1")
            assert lo <= first and last <= hi
    elif window == "crossing borders":
        middle = sorted(w["start"] for w in trace.work)[len(trace.work) // 2] + 7 * US  # inside some kernels
        lo, hi, args = middle, middle + 9 * MS + 3 * US, {"run": "r1", "start": middle, "end": middle + 9 * MS + 3 * US}
    else:
        steps = sorted((r["start"], r["end"]) for r in trace.ranges if r["name"] == "step")
        lo, hi = steps[4]
        args = {"run": "r1", "range": "step", "instance": 5}
    answer = client.gpu_time(min_gap_ns=50 * US, max_gaps=100_000, **args)
    expected = islands_by_gpu(trace, lo, hi)
    gpus = answer["gpus"].set_index("gpu")
    assert set(gpus.index) == set(expected)
    for gpu, merged in expected.items():
        busy = sum(e - s for s, e in merged)
        row = gpus.loc[gpu]
        assert (row["span_start_ns"], row["span_end_ns"]) == (lo, hi)
        assert row["busy_ns"] == busy and row["idle_ns"] == hi - lo - busy and row["islands"] == len(merged)
        assert row["busy_pct"] == pytest.approx(100 * busy / (hi - lo))
        gaps = sorted(
            (merged[i][1], merged[i + 1][0])
            for i in range(len(merged) - 1)
            if merged[i + 1][0] - merged[i][1] > 50 * US
        )
        got = answer["gaps"][answer["gaps"]["gpu"] == gpu]
        assert sorted(zip(got["start_ns"], got["end_ns"], strict=True)) == gaps
    lengths = list(answer["gaps"]["length_ns"])
    assert lengths == sorted(lengths, reverse=True), "longest first"


def test_gpu_time_without_a_window_spans_each_gpus_own_activity(client: Client, traces: dict[str, Trace]) -> None:
    answer = client.gpu_time(host=HOST)["gpus"].set_index("gpu")
    both = Trace("both", work=traces["r1"].work + traces["r2"].work)
    for gpu, merged in islands_by_gpu(both).items():
        assert answer.loc[gpu, "busy_ns"] == sum(e - s for s, e in merged)
        assert (answer.loc[gpu, "span_start_ns"], answer.loc[gpu, "span_end_ns"]) == (merged[0][0], merged[-1][1])


# -- nvtx-gpu -----------------------------------------------------------------------------------


def test_nvtx_ranges_project_onto_the_gpu_work_launched_inside(client: Client, traces: dict[str, Trace]) -> None:
    trace = traces["r1"]
    answer = client.nvtx_gpu(run="r1", limit=100_000)
    ranges = answer["ranges"]
    assert len(ranges) == len(trace.ranges)
    expected_by_name: dict[str, list[int | None]] = defaultdict(list)
    ops_by_name: dict[str, int] = defaultdict(int)
    got = {(row.tid, row.start_ns, row.name): row for row in ranges.itertuples()}
    for r in trace.ranges:
        inside = [w for w in trace.work if w["tid"] == r["tid"] and r["start"] <= w["launch"] < r["end"]]
        row = got[(r["tid"], r["start"], r["name"])]
        assert row.gpu_ops == len(inside)
        assert row.kernels == sum(w["kind"] == "kernel" for w in inside)
        if inside:
            first, last = min(w["start"] for w in inside), max(w["end"] for w in inside)
            assert (row.gpu_start_ns, row.gpu_end_ns, row.gpu_duration_ns) == (first, last, last - first)
            expected_by_name[r["name"]].append(last - first)
        else:
            assert pd.isna(row.gpu_start_ns) and pd.isna(row.gpu_duration_ns), "no GPU work: no projection"
        ops_by_name[r["name"]] += len(inside)
    summary = answer["summary"].set_index("name")
    for name, durations in expected_by_name.items():
        row = summary.loc[name]
        assert row["with_gpu_work"] == len(durations) and row["gpu_ops"] == ops_by_name[name]
        assert row["gpu_total_ns"] == sum(durations)
        assert row["gpu_med_ns"] == pytest.approx(statistics.median(durations))
        assert row["gpu_stddev_ns"] == pytest.approx(statistics.stdev(durations) if len(durations) > 1 else 0)
    assert summary.loc["idle", "with_gpu_work"] == 0 and summary.loc["idle", "instances"] == 2 * 40
    assert list(ranges["start_ns"]) == sorted(ranges["start_ns"])


def _made_now(store: Store, run: str) -> pd.DataFrame:
    """nvtx-gpu's summary of `run` with its projection made at the question, whatever is kept."""
    where = Predicates()
    where.add("run_id = {run_id:String}", run_id=run)
    return to_frame(store.query(*analysis.nvtx_gpu_summary(where)))


def _gpu_time(
    store: Store, run: str, kept: tuple[str, int] | None = None, whole: bool = False, min_gap: int = 1,
    max_gaps: int = 100_000,
) -> list[dict[str, object]]:  # fmt: skip
    where = Predicates()
    where.add("run_id = {run_id:String}", run_id=run)
    return store.query(*analysis.gpu_time(where, None, None, min_gap, max_gaps, kept, whole)).to_pylist()


def _kept_span(store: Store, run: str) -> tuple[int, int]:
    generation = store.query(kept_runs("SELECT {run_id:String}"), {"run_id": run}).to_pylist()[0]["generation"]
    span = store.query(*analysis.kept_span((run, generation))).to_pylist()[0]
    return span["first"], span["last"]


def _kept(store: Store, run: str) -> bool:
    where = Predicates()
    where.add("run_id = {run_id:String}", run_id=run)
    return all(row["kept"] for row in store.query(*analysis.kept_in_window(where)).to_pylist())


def test_a_kept_projection_answers_as_one_made_at_the_question(
    store: Store, client: Client, ingest: ingest_pb2_grpc.IngestStub, traces: dict[str, Trace]
) -> None:
    """Once an imported trace's projection is kept, nvtx-gpu reads it, and answers what it answered
    before; rows added to the run later (another trace imported into it) are seen at once."""
    made_now = _made_now(store, "r1")
    keep_runs(store)  # (serve's keeper may have kept them already)
    assert _kept(store, "r1") and _kept(store, "r2") and keep_runs(store) == 0
    kept = store.query("SELECT count() AS n FROM {db}.kept_ranges WHERE run_id = 'r1'").to_pylist()[0]["n"]
    assert kept == len(traces["r1"].ranges), "a row per range, stored once however often it is made"
    pd.testing.assert_frame_equal(client.nvtx_gpu(run="r1")["summary"], made_now)

    r = next(r for r in traces["r1"].ranges if r["name"] == "idle")  # a range with no GPU work
    added = BatchBuilder("r1-more", run_id="r1", host=HOST)
    added.add_events("kernel", [r["start"] + 20 * US], [r["start"] + 30 * US], "late", gpu=0, stream=7, pid=PID,
                     tid=r["tid"], launch_start=[r["start"] + 10 * US])  # fmt: skip
    ingest.Write(ingest_pb2.WriteRequest(batch=added.build()), timeout=30)
    assert not _kept(store, "r1"), "the kept projection is of rows that are no longer all"
    summary = client.nvtx_gpu(run="r1")["summary"].set_index("name")
    assert summary.loc["idle", "with_gpu_work"] == 1 and summary.loc["idle", "gpu_total_ns"] == 10 * US
    pd.testing.assert_frame_equal(client.nvtx_gpu(run="r1")["summary"], _made_now(store, "r1"))
    keep_runs(store)
    assert _kept(store, "r1")
    pd.testing.assert_frame_equal(client.nvtx_gpu(run="r1")["summary"], _made_now(store, "r1"))
    generations = store.query("SELECT DISTINCT generation FROM {db}.kept_ranges WHERE run_id = 'r1'").to_pylist()
    assert len(generations) == 1, "what was kept before is deleted on the embedded store"


def test_runs_kept_before_what_is_kept_changed_are_kept_again(
    store: Store, traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is kept is part of the fingerprint: runs kept by an earlier tracehouse (before kept_gpus and
    kept_gaps) are kept again, every table of them, and what was kept before is deleted."""
    keep_runs(store)

    def rows(run: str) -> dict[str, tuple[int, int]]:
        """Per kept table: the run's distinct rows (an answer kept twice is one), and of how many fingerprints."""
        sql = "SELECT %s AS n, uniqExact(generation) AS g FROM {db}.%s WHERE run_id = {run_id:String}"
        distinct = {"kept_answers": "uniqExact(generation, telemetry)"}
        counted = {
            table: store.query(sql % (distinct.get(table, "count()"), table), {"run_id": run}).to_pylist()[0]
            for table in KEPT_TABLES
        }
        return {table: (row["n"], row["g"]) for table, row in counted.items()}

    before = rows("r1")
    assert all(n > 0 for n, _ in before.values()), before
    monkeypatch.setattr("query.kept.WHAT_IS_KEPT", WHAT_IS_KEPT + 1)
    assert not _kept(store, "r1")
    assert keep_runs(store) >= 1 and _kept(store, "r1")
    assert rows("r1") == before
    monkeypatch.undo()
    keep_runs(store)


def test_serve_keeps_what_questions_read_of_imported_traces(
    store: Store, ingest: ingest_pb2_grpc.IngestStub, traces: dict[str, Trace]
) -> None:
    """serve keeps what it finds when it starts, and soon after each import ends (its run described),
    not only at its look every 10 minutes."""

    def kept_within(seconds: float, *runs: str) -> None:
        deadline = time.monotonic() + seconds
        while not all(_kept(store, run) for run in runs):
            assert time.monotonic() < deadline, f"serve has not kept {runs}"
            time.sleep(0.2)

    kept_within(60, "r1", "r2")
    time.sleep(3)  # any pass under way is over: only the import's end can start another within 10 minutes
    store_trace(ingest, make_trace("r3", seed=3, t0=traces["r2"].end + 1_000_000_000))
    kept_within(60, "r3")


def test_the_keeper_stops_when_asked(store: Store) -> None:
    keeper = Keeper(store, every_s=0.05, soon_s=0.05)
    keeper.start()
    time.sleep(0.3)  # a few passes over an empty store
    started = time.monotonic()
    keeper.close()
    assert time.monotonic() - started < 5


# -- phases -------------------------------------------------------------------------------------


def test_phases_attribute_gpu_busy_time_and_telemetry(client: Client, traces: dict[str, Trace]) -> None:
    trace = traces["r1"]
    answer = client.phases(run="r1")
    lo, hi = min(r["start"] for r in trace.ranges), max(r["end"] for r in trace.ranges)
    islands = islands_by_gpu(Trace("x", work=[w for w in trace.work if w["end"] > lo and w["start"] < hi]))
    names = sorted({r["name"] for r in trace.ranges})
    host_samples = traces["r1"].samples + traces["r2"].samples
    assert set(zip(answer["name"], answer["gpu"], strict=True)) == {(n, g) for n in names for g in (0, 1)}
    for row in answer.itertuples():
        instances = [(r["start"], r["end"]) for r in trace.ranges if r["name"] == row.name]
        total = sum(e - s for s, e in instances)
        busy = sum(overlap(i, island) for i in instances for island in islands.get(row.gpu, []))
        assert (row.instances, row.total_ns) == (len(instances), total)
        assert row.busy_pct == pytest.approx(100 * busy / total)
        inside: dict[str, list[float]] = defaultdict(list)
        for s in host_samples:  # the host's telemetry, whatever run sampled it; each sample once
            if s["gpu"] == row.gpu and any(i[0] <= s["ts"] < i[1] for i in instances):
                inside[s["metric"]].append(s["value"])
        assert row.samples == sum(len(v) for v in inside.values())
        assert row.gpu_util_pct_avg == pytest.approx(statistics.fmean(inside["gpu.util_pct"]))
        assert row.gpu_util_pct_max == max(inside["gpu.util_pct"])
        assert row.gpu_power_w_avg == pytest.approx(statistics.fmean(inside["gpu.power_w"]))
        assert pd.isna(row.gpu_mem_used_bytes_avg) and pd.isna(row.gpu_mem_used_bytes_max), (
            "no such series: no value, not a zero"
        )


def test_phases_of_a_kept_run_are_kept_while_the_telemetry_they_read_is(
    store: Store, client: Client, ingest: ingest_pb2_grpc.IngestStub, traces: dict[str, Trace],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """phases --run of a kept run over its whole span reads the answer kept with it; telemetry added inside
    its ranges (a late sample) makes the answer again at once, and that one is kept."""
    where = Predicates()
    where.add("run_id = {run_id:String}", run_id="r1")
    made_now = to_frame(store.query(*analysis.phases(where)))
    keep_runs(store)  # keeps the phases too (serve's keeper may have kept them already)
    monkeypatch.setattr("query.analysis.phases", lambda _: pytest.fail("phases made at the question"))
    pd.testing.assert_frame_equal(client.phases(run="r1"), made_now)
    monkeypatch.undo()

    step = next(r for r in traces["r1"].ranges if r["name"] == "step")
    late = BatchBuilder("r2-late", run_id="r2", host=HOST)
    late.add_samples("gpu.util_pct", [step["start"] + 5 * US], [100.0], gpu=0)
    ingest.Write(ingest_pb2.WriteRequest(batch=late.build()), timeout=30)
    answer = client.phases(run="r1")
    pd.testing.assert_frame_equal(answer, to_frame(store.query(*analysis.phases(where))))
    steps = answer.set_index(["name", "gpu"]).loc[("step", 0)]
    assert steps["samples"] == made_now.set_index(["name", "gpu"]).loc[("step", 0), "samples"] + 1
    monkeypatch.setattr("query.analysis.phases", lambda _: pytest.fail("phases made at the question"))
    pd.testing.assert_frame_equal(client.phases(run="r1"), answer)  # kept again


# -- launch -------------------------------------------------------------------------------------


def test_launch_statistics(client: Client, traces: dict[str, Trace]) -> None:
    trace = traces["r1"]
    answer = client.launch(short_ns=30 * US, run="r1")
    kernels = [w for w in trace.work if w["kind"] == "kernel"]
    latency = answer["latency"].set_index("name")
    for name in {k["name"] for k in kernels}:
        values = np.array([k["start"] - k["launch"] for k in kernels if k["name"] == name])
        row = latency.loc[name]
        assert row["kernels"] == values.size and row["avg_ns"] == pytest.approx(values.mean())
        for column, q in (("med_ns", 50), ("p90_ns", 90), ("p99_ns", 99)):
            assert row[column] == pytest.approx(np.percentile(values, q))
        assert (row["min_ns"], row["max_ns"]) == (values.min(), values.max())
    short = answer["short_kernels"].set_index("name")
    for name in {k["name"] for k in kernels}:
        durations = [k["end"] - k["start"] for k in kernels if k["name"] == name]
        n_short = sum(d < 30 * US for d in durations)
        if n_short:
            assert short.loc[name, "short"] == n_short and short.loc[name, "kernels"] == len(durations)
            assert short.loc[name, "short_total_ns"] == sum(d for d in durations if d < 30 * US)
        else:
            assert name not in short.index
    idle = answer["idle_after_sync"].set_index("gpu")
    for gpu, merged in islands_by_gpu(trace, trace.start, trace.end).items():
        gaps = [(merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1)]
        ends = [s["end"] for s in trace.syncs if s["gpu"] == gpu]
        after = [g for g in gaps if any(g[0] <= t < g[1] for t in ends)]
        assert idle.loc[gpu, "idle_ns"] == sum(e - s for s, e in gaps)
        assert idle.loc[gpu, "idle_after_sync_ns"] == sum(e - s for s, e in after)
        assert idle.loc[gpu, "gaps_after_sync"] == len(after) > 0


# -- diff ---------------------------------------------------------------------------------------


def test_diff_matches_kernels_by_name_biggest_change_first(client: Client, traces: dict[str, Trace]) -> None:
    answer = client.diff("r1", "r2")
    category = {"kernel": "kernels", "memcpy": "memops"}
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for side, trace in enumerate((traces["r1"], traces["r2"])):
        for w in trace.work:
            entry = totals[(category[w["kind"]], w["name"])]
            entry[side] += w["end"] - w["start"]
            entry[2 + side] += 1
    assert len(answer) == len(totals)
    for row in answer.itertuples():
        total_a, total_b, n_a, n_b = totals[(row.category, row.name)]
        assert (row.total_ns_a, row.total_ns_b, row.instances_a, row.instances_b) == (total_a, total_b, n_a, n_b)
        assert row.delta_ns == total_b - total_a
    deltas = list(answer["delta_ns"].abs())
    assert deltas == sorted(deltas, reverse=True)
    only_kernels = client.diff("r1", "r2", summaries=["kernels"], limit=2)
    assert set(only_kernels["category"]) == {"kernels"} and len(only_kernels) == 2


def test_bad_analysis_requests(client: Client, traces: dict[str, Trace]) -> None:
    with pytest.raises(QueryFailed, match="run 'nope' not found"):
        client.diff("r1", "nope")
    with pytest.raises(QueryFailed, match="no instance 99 of range 'step'"):
        client.gpu_time(run="r1", range="step", instance=99)
    with pytest.raises(QueryFailed, match="summaries"):
        client.diff("r1", "r2", summaries=["kernelz"])


def test_analyses_from_the_cli(
    client: Client, traces: dict[str, Trace], address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["gpu-time", "--run", "r1", "--min-gap", "50us"],
        ["nvtx-gpu", "--run", "r1", "--range", "step", "--instance", "3"],
        ["phases", "--run", "r1"],
        ["launch", "--run", "r1", "--short", "30us"],
        ["diff", "--run", "r1", "--run", "r2"],
    ):
        assert main(["query", *argv, "--server", address, "--format", "json"]) == 0, argv
        document = json.loads(capsys.readouterr().out)
        assert document, argv
    assert main(["query", "diff", "--run", "r1", "--server", address]) == 2
    assert "two runs" in capsys.readouterr().err
    assert main(["query", "gpu-time", "--run", "r1", "--server", address, "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# gpus\nhost,gpu,span_start_ns") and "\n# gaps\n" in out


NSYS = FIXTURES / "nsys"


@pytest.mark.skipif(not NSYS.is_dir(), reason=f"no real exports in {NSYS}")
def test_every_analysis_runs_on_every_real_export(store: Store, client: Client, address: str) -> None:
    """... and what is kept of each export answers as its events do."""
    from agent.shipping.writer import BatchWriter
    from agent.traces.importer import import_export

    writer = BatchWriter(address)
    runs = [import_export(path, writer).run_id for path in sorted(NSYS.glob("*.sqlite"))]
    writer.close()
    for run in runs:
        client.gpu_time(run=run)
        client.nvtx_gpu(run=run)
        client.phases(run=run)
        client.launch(run=run)
    few_long_gaps = {"min_gap": 5000, "max_gaps": 3}  # the gaps asked for: a few of those over 5 µs
    made_now = {
        run: (_made_now(store, run), _gpu_time(store, run), _gpu_time(store, run, **few_long_gaps)) for run in runs
    }
    keep_runs(store)
    compared = 0
    for run in runs:
        fingerprint = store.query(kept_runs("SELECT {run_id:String}"), {"run_id": run}).to_pylist()
        if not fingerprint:
            continue  # no ranges, no GPU work: nothing to keep
        assert fingerprint[0]["kept"], run
        summary = client.nvtx_gpu(run=run)["summary"]
        pd.testing.assert_frame_equal(summary, made_now[run][0], check_exact=False, rtol=1e-9)
        kept = (run, fingerprint[0]["generation"])
        assert _gpu_time(store, run, kept) == made_now[run][1] == _gpu_time(store, run, kept, whole=True), run
        assert _gpu_time(store, run, kept, whole=True, **few_long_gaps) == made_now[run][2], run
        compared += 1
    assert compared >= len(runs) - 1, "every export but one has ranges or GPU work"
    projected = client.nvtx_gpu(run=runs[2])["summary"].set_index("name")  # 2022.2: MPI ranges around saxpy
    assert projected.loc["saxpy", "kernels"] == 5 and projected.loc["saxpy", "with_gpu_work"] == 5
    assert not client.diff(runs[0], runs[1]).empty


def test_fixture_path_helper_exists() -> None:
    assert isinstance(FIXTURES, Path)


def test_servers_without_materialized_ctes_give_the_same_answers(
    store: Store, client: Client, traces: dict[str, Trace]
) -> None:
    """ClickHouse before 26.1 (and any cluster) has no `AS MATERIALIZED`: the store asks without it."""
    assert store.materialized_cte  # chDB has it
    span = {"run": "r1", "start": traces["r1"].start, "end": traces["r1"].end}  # made at the question, not kept
    with_it = (client.phases(**span), client.nvtx_gpu(run="r1", limit=50))
    store.materialized_cte = False
    without = (client.phases(**span), client.nvtx_gpu(run="r1", limit=50))
    pd.testing.assert_frame_equal(with_it[0], without[0])
    for part in ("summary", "ranges"):
        pd.testing.assert_frame_equal(with_it[1][part], without[1][part])
    assert "MATERIALIZED" not in without_materialized_cte(analysis.phases(Predicates())[0])


def test_a_traces_answers_depend_only_on_that_trace(
    client: Client, ingest: ingest_pb2_grpc.IngestStub, traces: dict[str, Trace]
) -> None:
    """The same profile imported again (another run: same host, process, threads and times) and another
    profile of the same process at the same time change none of r1's answers: a trace's ranges meet the
    GPU work of that trace only, as Nsight Systems' projection sees one report."""

    def answers() -> tuple[pd.DataFrame, ...]:
        projected = client.nvtx_gpu(run="r1", limit=100_000)
        span = {"run": "r1", "start": traces["r1"].start, "end": traces["r1"].end}  # made at the question
        phases = client.phases(**span)[["name", "host", "gpu", "instances", "total_ns", "busy_pct"]]
        return projected["summary"], projected["ranges"], phases

    before = answers()
    again = dataclasses.replace(traces["r1"], run_id="r1-again", samples=[])
    other = dataclasses.replace(make_trace("r3", seed=3, t0=traces["r1"].start), samples=[])
    for trace in (again, other):
        store_trace(ingest, trace)
    assert client.nvtx_gpu(run="r1-again")["summary"].equals(before[0]), "the copy answers as the original"
    for was, now in zip(before, answers(), strict=True):
        pd.testing.assert_frame_equal(was, now)


def test_phases_of_one_run_meet_the_gpu_work_of_a_trace_of_the_same_process(
    client: Client, ingest: ingest_pb2_grpc.IngestStub
) -> None:
    """agent.training's phases and the PyTorch profiler's kernels are two runs: they meet on
    their host, process and thread, not their run id."""
    t0, pid, tid = 1_790_000_000_000_000_000, 4242, 77
    declared = BatchBuilder("api", run_id="train.1", host="gpu-node")
    starts = t0 + np.arange(4) * 10 * MS
    declared.add_events("phase", starts, starts + 6 * MS, "forward", pid=pid, tid=tid)
    declared.add_run("train.1", host="gpu-node", source="user", start=t0, end=t0 + 40 * MS)
    traced = BatchBuilder("trace", run_id="kineto-1", host="gpu-node")
    launches = starts + 1 * MS
    traced.add_events("kernel", launches + 500 * US, launches + 2500 * US, "gemm", gpu=0, stream=7, pid=pid, tid=tid,
                      launch_start=launches)  # fmt: skip
    traced.add_events("kernel", [t0 + 8 * MS], [t0 + 9 * MS], "other", gpu=0, stream=7, pid=pid, tid=tid + 1,
                      launch_start=[t0 + 2 * MS])  # another thread's: not the phase's  # fmt: skip
    traced.add_run("kineto-1", host="gpu-node", source="kineto", start=t0, end=t0 + 40 * MS)
    for builder in (declared, traced):
        ingest.Write(ingest_pb2.WriteRequest(batch=builder.build()), timeout=30)
    summary = client.nvtx_gpu(run="train.1")["summary"].set_index("name")
    assert summary.loc["forward", "instances"] == summary.loc["forward", "with_gpu_work"] == 4
    assert summary.loc["forward", "gpu_ops"] == 4 and summary.loc["forward", "gpu_total_ns"] == 4 * 2 * MS
    phases = client.phases(run="train.1").set_index("name")
    assert phases.loc["forward", "gpu"] == 0
    assert phases.loc["forward", "busy_pct"] == pytest.approx(100 * 2 / 6)
