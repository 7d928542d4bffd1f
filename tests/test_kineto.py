"""PyTorch-profiler (Kineto) import: the real traces of ../shared/fixtures/kineto against an
independent reading of their JSON, synthetic traces for chunking, linking and the edge cases,
and bad input refused with nothing stored."""

from __future__ import annotations

import gzip
import json
import re
import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from agent.traces.kineto import CHUNK_ROWS, KinetoError, KinetoTrace, to_ns
from agent.traces.kineto_synthetic import BASE_NS, KinetoSpec, imported_per_step, write_trace
from agent.traces.tracefile import TraceFileError, sniff
from query.client import Client
from tests.conftest import FIXTURES
from tests.helpers import import_refused
from tracehouse.cli.main import main

KINETO = FIXTURES / "kineto"
REAL = sorted(KINETO.glob("*.json.gz")) if KINETO.is_dir() else []
needs_fixtures = pytest.mark.skipif(not REAL, reason=f"no real traces in {KINETO}")
NS_RESOLUTION = KINETO / "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
TORCH_CPU = Path(__file__).parent / "data" / "kineto" / "cpu_mlp_torch2.pt.trace.json.gz"
TORCH_CPU_MADE_NS = 1_795_985_393_803_324_811  # when it was made (tests/data/kineto/SOURCES.md)


@pytest.fixture
def writer(address: str) -> Iterator[BatchWriter]:
    opened = BatchWriter(address, patience=10)
    yield opened
    opened.close()


# -- an independent reading of the JSON ---------------------------------------------------------

X_KINDS = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_sync": "sync",
    "cuda_runtime": "cuda_api", "cuda_driver": "cuda_api", "cpu_op": "cpu_op", "python_function": "python",
    "gpu_user_annotation": "gpu_annotation",
}  # fmt: skip


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        trace: dict[str, Any] = json.load(file, parse_float=Decimal)
    return trace


def ns(us: int | Decimal) -> int:
    return int((Decimal(us) * 1000).to_integral_value())


def imported(trace: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, event) of each event that becomes a row."""
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and event.get("cat") == "user_annotation":
            yield "step" if event["name"].startswith("ProfilerStep#") else "nvtx", event
        elif event.get("ph") == "X" and event.get("cat") in X_KINDS:
            yield X_KINDS[event["cat"]], event
        elif event.get("ph") in ("i", "I"):
            yield "mark", event


def expected_events(trace: dict[str, Any]) -> dict[str, int]:
    return dict(Counter(kind for kind, _ in imported(trace)))


def by_name(trace: dict[str, Any], categories: tuple[str, ...], rename: Callable[[str], str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and event.get("cat") in categories:
            groups[rename(event["name"])].append(ns(event.get("dur", 0)))
    return groups


def memop_name(name: str) -> str:
    kinds = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "DtoD": "Device-to-Device", "HtoH": "Host-to-Host"}
    copy = re.fullmatch(r"Memcpy (\w+) \(.*\)", name)
    return f"[CUDA memcpy {kinds[copy.group(1)]}]" if copy else "[CUDA memset]"


def stored_events(client: Client, run_id: str) -> dict[str, int]:
    frame = client.sql(
        f"SELECT kind, count() AS n FROM events WHERE run_id = '{run_id}' "
        "AND kind NOT IN ('process', 'thread') GROUP BY kind"
    )
    return dict(zip(frame["kind"], (int(n) for n in frame["n"]), strict=True))


def summary(address: str, report: str, run_id: str, capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[int, int]]:
    assert main(["query", report, "--run", run_id, "--server", address, "--format", "json"]) == 0
    return {row["name"]: (row["instances"], row["total_ns"]) for row in json.loads(capsys.readouterr().out)}


def totals(groups: dict[str, list[int]]) -> dict[str, tuple[int, int]]:
    return {name: (len(values), sum(values)) for name, values in groups.items()}


# -- real traces -----------------------------------------------------------------------------------


@needs_fixtures
@pytest.mark.parametrize("path", REAL, ids=[p.name.split("_benchmark")[0][:40] for p in REAL])
def test_real_trace_imports_every_event_and_its_summaries_match_the_json(
    path: Path, writer: BatchWriter, client: Client, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = load(path)
    result = import_export(path, writer)
    expected = expected_events(trace)
    assert result.events == expected
    assert stored_events(client, result.run_id) == expected
    kernels = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    stored = client.sql(
        f"SELECT count() AS n, sum(toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)) AS t "
        f"FROM events WHERE run_id = '{result.run_id}' AND kind = 'kernel'"
    ).iloc[0]
    assert (int(stored["n"]), int(stored["t"])) == (len(kernels), sum(ns(e["dur"]) for e in kernels))
    assert summary(address, "kernels", result.run_id, capsys) == totals(by_name(trace, ("kernel",), str))
    api = by_name(trace, ("cuda_runtime", "cuda_driver"), lambda name: re.sub(r"_v\d+$", "", name))
    assert summary(address, "api", result.run_id, capsys) == totals(api)
    memops = by_name(trace, ("gpu_memcpy", "gpu_memset"), memop_name)
    assert summary(address, "memops", result.run_id, capsys) == totals(memops)
    run = client.runs().set_index("run_id").loc[result.run_id]
    assert run["source"] == "kineto" and not run["relative_time"] and result.run_id.startswith("kineto-")
    assert run["attrs"]["sha256"] and run["attrs"]["events.cpu_op"] == str(expected["cpu_op"])
    assert int(run["start"].value) == min(ns(event["ts"]) for _, event in imported(trace)), "µs since the epoch"
    assert len(client.devices()) == len(trace.get("deviceProperties", []))
    assert set(result.skipped) <= {"flow", "category Trace", "category cuda_profiler_range"}


@needs_fixtures
def test_importing_again_changes_nothing(writer: BatchWriter, client: Client) -> None:
    first = import_export(NS_RESOLUTION, writer)
    before = client.sql("SELECT count() AS n, sum(cityHash64(*)) AS h FROM events").iloc[0].to_dict()
    batches_before = writer.batches
    second = import_export(NS_RESOLUTION, writer)
    assert second.run_id == first.run_id and second.events == first.events
    assert writer.duplicates == writer.batches - batches_before, "every batch was already stored"
    assert client.sql("SELECT count() AS n, sum(cityHash64(*)) AS h FROM events").iloc[0].to_dict() == before
    assert len(client.runs()) == 1


@needs_fixtures
def test_gpu_work_is_linked_to_the_call_that_launched_it(writer: BatchWriter, client: Client) -> None:
    trace = load(NS_RESOLUTION)
    calls = {
        e["args"]["correlation"]: (ns(e["ts"]), e["pid"], e["tid"])
        for e in trace["traceEvents"]
        if e.get("cat") == "cuda_runtime"
    }
    result = import_export(NS_RESOLUTION, writer)
    work = client.events(kinds=["kernel", "memcpy", "memset"], run=result.run_id, limit=100_000)
    assert len(work) == 4350 + 1600 + 145
    for row in work.itertuples():
        start, pid, tid = calls[row.correlation_id]
        assert (int(row.launch_start.value), row.pid, row.tid) == (start, pid, tid)
    kernel = work[work["kind"] == "kernel"].iloc[0]
    assert re.fullmatch(r"grid \d+x\d+x\d+, block \d+x\d+x\d+, \d+ registers, \d+ B shared", kernel["extras"]["launch"])
    assert kernel["gpu"] == 0 and kernel["stream"] == 7
    run = client.runs().iloc[0]
    assert run["host"] == "twshared39868.02.pnb3.facebook.com", "the trace's host_name"
    steps = client.events(kinds=["step"], run=result.run_id)
    assert set(steps["name"]) == {"step"}, "as the training API names steps"
    assert [extras["step"] for extras in steps["extras"]] == [str(n) for n in range(101, 106)]
    assert set(steps["depth"]) == {0}
    forward = client.events(kinds=["nvtx"], names=["## forward ##"], run=result.run_id)
    assert len(forward) == 5 and set(forward["depth"]) == {1}, "inside its step"
    names = client.events(kinds=["thread"], run=result.run_id)
    assert len(names) == 2 and all(name.startswith("thread ") for name in names["name"])


@needs_fixtures
def test_ns_decimals_are_kept_exactly(writer: BatchWriter, client: Client) -> None:
    """ts of ~1.7e15 µs with ns decimals: a binary float would lose them (its step is 0.25 µs)."""
    trace = load(NS_RESOLUTION)
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    assert any(isinstance(e["ts"], Decimal) and e["ts"] != int(e["ts"]) for e in ops)
    result = import_export(NS_RESOLUTION, writer)
    frame = client.sql(
        f"SELECT toUnixTimestamp64Nano(start) AS s, toUnixTimestamp64Nano(end) AS e FROM events "
        f"WHERE run_id = '{result.run_id}' AND kind = 'cpu_op'"
    )
    assert sorted(zip(frame["s"], frame["e"], strict=True)) == sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in ops
    )


@needs_fixtures
def test_fixtures_are_not_copied_into_the_project() -> None:
    here = Path(__file__).resolve().parents[1]
    names = {p.name for p in REAL}
    assert not [p for p in here.rglob("*.json.gz") if p.name in names and ".venv" not in p.parts]


def test_a_trace_of_torch_2_on_the_cpu_in_this_project(writer: BatchWriter, client: Client) -> None:
    """A current PyTorch (2.13, CPU) trace, committed: the modern time base, tested where torch is not."""
    trace = load(TORCH_CPU)
    assert type(trace["baseTimeNanoseconds"]) is int and next(iter(trace)) == "schemaVersion"
    assert list(trace).index("baseTimeNanoseconds") < list(trace).index("traceEvents"), "torch 2.13 writes it first"
    result = import_export(TORCH_CPU, writer)
    expected = expected_events(trace)
    assert result.events == expected and stored_events(client, result.run_id) == expected
    assert "kernel" not in result.events, "CPU only"
    assert result.events["cpu_op"] == sum(1 for e in trace["traceEvents"] if e.get("cat") == "cpu_op") == 342
    run = client.runs().set_index("run_id").loc[result.run_id]
    assert not result.relative_time and run["host"] == "vm" == result.host
    assert abs(int(run["start"].value) - TORCH_CPU_MADE_NS) < 10**9, "ts counts from baseTimeNanoseconds"
    assert int(run["start"].value) == min(trace["baseTimeNanoseconds"] + ns(e["ts"]) for _, e in imported(trace))
    steps = client.events(kinds=["step"], run=result.run_id)
    assert list(steps["name"]) == ["step"] * 3 and [x["step"] for x in steps["extras"]] == ["1", "2", "3"]
    assert set(steps["depth"]) == {0}


# -- synthetic traces ----------------------------------------------------------------------------------


def test_a_trace_of_several_chunks_links_across_them_and_nests_its_ranges(
    tmp_path: Path, writer: BatchWriter, client: Client
) -> None:
    spec = KinetoSpec(steps=3000, kernels_per_step=5)  # 81 k rows: two chunks
    path = tmp_path / "big.pt.trace.json.gz"
    write_trace(path, spec)
    result = import_export(path, writer, run_name="resnet", host="node-1", tags={"bs": "256"})
    assert sum(result.events.values()) == spec.steps * imported_per_step(spec) > CHUNK_ROWS
    assert result.events["kernel"] == 15_000 and result.skipped == {"flow": 3000 * 12}
    unlinked = client.sql(
        f"SELECT count() AS n FROM events WHERE run_id = '{result.run_id}' "
        "AND kind IN ('kernel', 'memcpy') AND (launch_start IS NULL OR tid != 4242)"
    )
    assert int(unlinked["n"][0]) == 0, "every kernel and copy found its call, across chunk borders too"
    run = client.runs().iloc[0]
    assert (run["name"], run["host"], run["tags"]) == ("resnet", "node-1", {"bs": "256"})
    assert int(run["start"].value) == BASE_NS + 1_000_000, "ts from baseTimeNanoseconds, given after the events"
    ranges = client.events(kinds=["step", "nvtx"], run=result.run_id, limit=3)
    assert list(zip(ranges["name"], ranges["depth"], strict=True)) == [
        ("step", 0), ("## forward ##", 1), ("## backward ##", 1)
    ]  # fmt: skip
    projected = client.nvtx_gpu(run=result.run_id)["summary"].set_index("name")
    assert projected.loc["## forward ##", "kernels"] > 0, "record_function ranges project onto GPU work"
    assert (projected.loc["step", "instances"], projected.loc["step", "kernels"]) == (3000, 15_000)
    ops = client.events(kinds=["cpu_op"], run=result.run_id, limit=2)
    assert list(ops["depth"]) == [0, 1]
    sync = client.events(kinds=["sync"], run=result.run_id)
    assert sync.empty


def test_an_interrupted_import_is_invisible_and_finished_by_running_it_again(
    tmp_path: Path, writer: BatchWriter, client: Client
) -> None:
    from tests.test_nsys import FailAfter

    spec = KinetoSpec(steps=3000)
    path = tmp_path / "big.json.gz"
    write_trace(path, spec)
    with pytest.raises(KeyboardInterrupt):
        import_export(path, FailAfter(writer, 2))
    writer.flush()
    assert int(client.sql("SELECT count() AS n FROM events")["n"][0]) > 0
    assert client.runs().empty and client.events().empty
    result = import_export(path, writer)
    assert sum(stored_events(client, result.run_id).values()) == spec.steps * imported_per_step(spec)


def write_json(path: Path, trace: Any, compress: bool = False) -> Path:
    text = json.dumps(trace) if not isinstance(trace, str) else trace
    if compress:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


T0_US = 1_790_000_000_000_000  # µs since the epoch


def test_edge_cases(tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    events: list[Any] = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": T0_US, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "no args, no pid", "ts": T0_US + 1, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "ts": T0_US + 2, "dur": 1},  # no name
        {"ph": "X", "cat": "cpu_op", "name": "no dur", "pid": 1, "tid": 2, "ts": T0_US + 3},
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 2, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "ts as text", "pid": 1, "tid": 2, "ts": "12", "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "negative dur", "pid": 1, "tid": 2, "ts": T0_US, "dur": -3},
        {"ph": "X", "cat": "something new", "name": "x", "pid": 1, "tid": 2, "ts": T0_US, "dur": 1},
        {"ph": "X", "name": "no category", "pid": 1, "tid": 2, "ts": T0_US, "dur": 1},
        {"ph": "X", "cat": ["a", "list"], "name": "odd category", "ts": T0_US, "dur": 1},
        {"ph": "B", "name": "begin", "pid": 1, "tid": 2, "ts": T0_US},
        {"ph": "s", "id": 77, "pid": 1, "tid": 2, "ts": T0_US, "cat": "ac2g", "name": "ac2g"},  # no partner
        {"ph": "f", "id": 78, "pid": 0, "tid": 7, "ts": T0_US, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "i", "name": "a mark", "pid": "Traces", "tid": "Trace", "ts": T0_US + 5, "s": "g"},
        {"ph": "X", "cat": "kernel", "name": "k_no_args", "pid": 0, "tid": 7, "ts": T0_US + 20, "dur": 2},
        {"ph": "X", "cat": "kernel", "name": "k_no_call", "pid": 0, "tid": 7, "ts": T0_US + 30, "dur": 2,
         "args": {"device": 3, "stream": 9, "correlation": 999, "grid": [1, 2], "bytes": "x"}},
        {"ph": "X", "cat": "kernel", "name": "k_ns", "pid": 0, "tid": 7, "ts": T0_US + Decimal("40.0005"),
         "dur": Decimal("1.0015"), "args": {"device": -1, "correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "k_past_the_gpus", "pid": 0, "tid": 7, "ts": T0_US + 20, "dur": 2,
         "args": {"device": 9999}},  # no GPU index: skipped, not filed under no GPU
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel_v2", "pid": 1, "tid": 2, "ts": T0_US + 39,
         "dur": 1, "args": {"correlation": 5}},
        {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "pid": 0, "tid": -1, "ts": T0_US + 50, "dur": 4,
         "args": {"cuda_sync_kind": "Event Sync", "stream": -1, "correlation": 6, "device": 0}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "pid": 1, "tid": 2, "ts": T0_US + 49,
         "dur": 6, "args": {"correlation": 6}},
        {"ph": "X", "cat": "user_annotation", "name": "x" * 70_000, "pid": 1, "tid": 2, "ts": T0_US, "dur": 60},
        {"ph": "X", "cat": "python_function", "name": "train.py(12): step", "pid": 1, "tid": 2, "ts": T0_US,
         "dur": 60, "args": {"Python id": 1}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "trainer"}},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python3"}},
        "not an event",
        {"ph": "X", "cat": "cpu_op", "name": "after the end of time", "ts": 10**17, "dur": 1},
    ]  # fmt: skip
    text = json.dumps({"traceEvents": events}, default=str).replace('"1790000000000040.0005"', "1790000000000040.0005")
    text = text.replace('"1.0015"', "1.0015")
    path = write_json(tmp_path / "edge.json", text)
    result = import_export(path, writer)
    assert result.events == {"cpu_op": 4, "kernel": 3, "cuda_api": 2, "sync": 1, "nvtx": 1, "python": 1, "mark": 1}
    assert result.skipped == {
        "no time": 2, "bad duration": 1, "category something new": 1, "category NoneType": 1, "category list": 1,
        "phase B": 1, "flow": 2, "not an event": 1, "time out of range": 1, "device out of range": 1,
    }  # fmt: skip
    rows = client.events(run=result.run_id, limit=100).set_index("name")
    assert rows.loc["no dur", "start"] == rows.loc["no dur", "end"], "an X event without dur is an instant"
    assert rows.loc["", "kind"] == "cpu_op" and rows.loc["no args, no pid", "pid"] == 0
    assert rows.loc["a mark", "extras"] == {"track": "Traces / Trace"}
    kernel = rows.loc["k_ns"]
    assert int(kernel["start"].value) == T0_US * 1000 + 40_000 + 0, "40.0005 µs: half to even, 40000 ns"
    assert int(kernel["end"].value) - int(kernel["start"].value) == 1_002, "1.0015 µs: 1002 ns (half to even)"
    assert kernel["gpu"] == -1 and kernel["launch_start"] == rows.loc["cuLaunchKernel", "start"]
    assert rows.loc["cuLaunchKernel", "extras"] == {"api": "driver"}
    lonely = rows.loc["k_no_call"]
    assert (lonely["gpu"], lonely["stream"], lonely["correlation_id"], lonely["pid"]) == (3, 9, 999, 0)
    assert pd_isna(lonely["launch_start"]) and "launch" not in lonely["extras"]
    sync = rows.loc["cudaEventSynchronize"]
    assert list(sync["kind"]) == ["cuda_api", "sync"], "a sync is named by its call, as with nsys"
    assert sync.set_index("kind").loc["sync", "extras"] == {"sync_type": "Event Sync"}
    long_name = next(name for name in rows.index if name.startswith("xxx"))
    assert len(long_name.encode()) == 65_536
    names = client.events(kinds=["thread", "process"], run=result.run_id)
    assert set(zip(names["kind"], names["name"], strict=True)) == {("thread", "trainer"), ("process", "python3")}
    assert client.runs().iloc[0]["attrs"]["skipped.flow"] == "2"


def test_names_and_flows_before_the_first_timed_event(tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    events: list[Any] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python3"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "trainer"}},
        {"ph": "f", "id": 1, "pid": 1, "tid": 2, "ts": 5, "cat": "ac2g", "name": "ac2g"},
        {"ph": "X", "cat": "cpu_op", "name": "no time", "pid": 1, "tid": 2},
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 2, "ts": T0_US, "dur": 1},
    ]
    result = import_export(write_json(tmp_path / "t.json", {"traceEvents": events}), writer)
    assert result.events == {"cpu_op": 1} and result.skipped == {"flow": 1, "no time": 1}
    assert not result.relative_time
    names = client.events(kinds=["thread", "process"], run=result.run_id)
    assert set(names["name"]) == {"trainer", "python3"}


def test_events_out_of_order_never_overlap_in_a_lane(tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    """Nested ranges written in reverse, and ranges that overlap without nesting: each still gets
    a lane of its thread where no other range overlaps it (what the range analyses rely on)."""
    spans = [(0, 100), (10, 50), (20, 30), (40, 120), (60, 70), (5, 15), (100, 130)]
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"r{i}", "pid": 1, "tid": 1, "ts": T0_US + s, "dur": e - s}
        for i, (s, e) in reversed(list(enumerate(spans)))
    ]
    result = import_export(write_json(tmp_path / "t.json", {"traceEvents": events}), writer)
    ranges = client.events(kinds=["nvtx"], run=result.run_id)
    assert len(ranges) == len(spans)
    lanes: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for row in ranges.itertuples():
        lanes[row.depth].append((int(row.start.value), int(row.end.value)))
    for taken in lanes.values():
        taken.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in pairwise(taken))


def pd_isna(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


@pytest.mark.parametrize(
    ("layout", "base"),
    [("object", "after"), ("object", "before"), ("object", "none"), ("array", "none"), ("object", "both")],
)
def test_time_bases(layout: str, base: str, tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    relative = base != "none"
    ts = 1_000 if relative else T0_US
    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": ts, "dur": 1}]
    base_ns = T0_US * 1000 - 1_000_000
    if base == "both":
        events[0]["ts"] = T0_US  # already since the epoch: the base is not added again
    if layout == "array":
        text = json.dumps(events)
    elif base == "before":
        text = json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": events})
    elif base in ("after", "both"):
        text = json.dumps(
            {"traceEvents": events, "traceName": "t", "INFO": ["a ] , {", [1]], "baseTimeNanoseconds": base_ns}
        )
    else:
        text = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})
    result = import_export(write_json(tmp_path / "t.json", text, compress=True), writer)
    start = int(client.events(run=result.run_id)["start"][0].value)
    assert start == T0_US * 1000 and not result.relative_time


def test_relative_time_without_a_base(tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 12.5, "dur": 1}]
    result = import_export(write_json(tmp_path / "rel.json", {"traceEvents": events}), writer)
    assert result.relative_time and client.runs().iloc[0]["relative_time"]
    assert int(client.events(run=result.run_id)["start"][0].value) == 12_500


def test_invalid_utf8_is_replaced(tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    raw = b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "op\xff\xfe!", "ts": 1790000000000000, "dur": 1}]}'
    path = tmp_path / "bytes.json"
    path.write_bytes(raw)
    result = import_export(path, writer)
    assert client.events(run=result.run_id)["name"][0] == "op\ufffd\ufffd!"
    assert "utf8" in client.runs().iloc[0]["attrs"]


def test_an_empty_trace_is_a_run_without_events(tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    result = import_export(write_json(tmp_path / "empty.json", {"traceEvents": []}), writer)
    assert result.events == {} and len(client.runs()) == 1


def test_to_ns_is_exact_and_refuses_what_is_not_a_number() -> None:
    assert to_ns(Decimal("1712195495406752.797")) == 1_712_195_495_406_752_797
    assert to_ns(Decimal("0.0025")) == 2 and to_ns(Decimal("0.0035")) == 4  # half to even
    assert to_ns(7) == 7_000 and to_ns(Decimal("1E+3")) == 1_000_000
    assert to_ns(True) is None and to_ns("5") is None and to_ns(None) is None and to_ns(Decimal("1E+99")) is None


# -- bad input ---------------------------------------------------------------------------------------


def _truncated_gzip(path: Path) -> None:
    write_trace(path, KinetoSpec(steps=50))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BAD_INPUT: dict[str, tuple[Callable[[Path], Any], str]] = {
    "not JSON": (lambda p: p.write_text("{this is not json"), "not JSON"),
    "not valid JSON": (lambda p: p.write_text('{"traceEvents": [oops]}'), "not valid JSON after 0 events"),
    "text": (lambda p: p.write_text("hello, world\n"), "not JSON"),
    "JSON, not a trace": (lambda p: write_json(p, {"name": "a config file", "x": [1, 2]}), "not a Chrome trace"),
    "a list of numbers": (lambda p: write_json(p, [1, 2, 3]), "not a Chrome trace"),
    "traceEvents not a list": (lambda p: write_json(p, {"traceEvents": 5}), "not a Chrome trace"),
    "a list of metrics": (
        lambda p: write_json(p, [{"name": "loss", "value": 0.3}, {"name": "loss", "value": 0.2, "ts": 5}]),
        "not a Chrome trace",
    ),
    "events without a phase": (
        lambda p: write_json(p, {"traceEvents": [{"name": "op", "ts": T0_US, "dur": 1}, {"ph": 5, "ts": 1}]}),
        "not a Chrome trace",
    ),
    "truncated gzip": (_truncated_gzip, "truncated or corrupt gzip"),
    "corrupt gzip": (lambda p: p.write_bytes(gzip.compress(b'{"traceEvents": []}')[:-4] + b"\0\0\0\0"), "gzip"),
    "truncated JSON": (lambda p: p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "na'), "truncated"),
    "truncated after an event": (
        lambda p: p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1}'),
        "not valid JSON after 1 events (parse error: premature EOF)",
    ),
    "gzip of text": (lambda p: p.write_bytes(gzip.compress(b"a,b\n1,2\n")), "not JSON"),
    "empty file": (lambda p: p.write_bytes(b""), "empty file"),
    "empty gzip": (lambda p: p.write_bytes(gzip.compress(b"")), "empty once decompressed"),
    "unpaired surrogate": (
        lambda p: p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a\\udc00", "ts": 1}]}'),
        "surrogate",
    ),
    "broken in the middle": (
        lambda p: p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1}, {"ph": ]}'),
        "not valid JSON",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_exits_2_with_a_reason_and_stores_nothing(
    case: str, tmp_path: Path, address: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    make, reason = BAD_INPUT[case]
    path = tmp_path / ("trace.json.gz" if "gzip" in case else "trace.json")
    make(path)

    def nothing_stored() -> bool:
        counts = client.sql("SELECT (SELECT count() FROM events) AS e, (SELECT count() FROM runs) AS r").iloc[0]
        return (int(counts["e"]), int(counts["r"])) == (0, 0)

    good = tmp_path / "good.json.gz"
    import_refused(path, reason, address, capsys, nothing_stored, (good, lambda p: write_trace(p, KinetoSpec(steps=2))))


def test_the_cli_files_a_trace_without_a_host_under_this_machine(
    tmp_path: Path, address: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    """Most Kineto traces name no host; the CLI imports one on the machine that made it, usually,
    so it files it there (beside that machine's telemetry) and says so; --host and the trace's own win."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": T0_US, "dur": 1}]
    nameless = write_json(tmp_path / "nameless.json", {"traceEvents": events})
    named = write_json(tmp_path / "named.json", {"traceEvents": events, "hostname": "node-7"})
    assert main(["import", "--server", address, str(nameless)]) == 0
    out, err = capsys.readouterr()
    here = socket.gethostname()
    assert json.loads(out)["host"] == here and f"filed under this machine, {here} (--host" in err
    assert main(["import", "--server", address, "--host", "elsewhere", str(nameless), str(named)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["import", "--server", address, str(named)]) == 0
    assert json.loads(capsys.readouterr().out)["host"] == "node-7"
    hosts = client.runs().groupby("host").size().to_dict()
    assert hosts == {here: 1, "elsewhere": 2, "node-7": 1}
    assert import_export(nameless, BatchWriter(address)).host == "unknown", "the API's default stays"


def test_errors_are_kineto_errors_of_one_line(tmp_path: Path) -> None:
    path = write_json(tmp_path / "x.json", {"traceEvents": [1]})
    with pytest.raises(KinetoError) as caught:
        KinetoTrace(path)
    assert isinstance(caught.value, TraceFileError) and "\n" not in str(caught.value)


def test_formats_are_told_by_content_not_by_name(tmp_path: Path) -> None:
    cases = {
        "a.sqlite": (b"SQLite format 3\x00" + bytes(100), "nsys"),
        "trace.sqlite": (b'  \n{"traceEvents": []}', "kineto"),
        "export.json": (b"SQLite format 3\x00", "nsys"),
        "t.bin": (gzip.compress(b"[]"), "kineto"),
        "r.nsys-rep": (gzip.compress(b"x"), "nsys"),
        "bom.json": (b"\xef\xbb\xbf[]", "kineto"),
    }
    for name, (content, expected) in cases.items():
        (tmp_path / name).write_bytes(content)
        assert sniff(tmp_path / name) == expected, name
    (tmp_path / "csv.txt").write_bytes(b"a,b")  # neither: refused naming both formats
    with pytest.raises(TraceFileError, match="not a SQLite file, nor JSON: tracehouse imports Nsight"):
        sniff(tmp_path / "csv.txt")
    (tmp_path / "blank").write_bytes(b"  \n")
    with pytest.raises(TraceFileError, match="empty"):
        sniff(tmp_path / "blank")


def test_bench_import_kineto_runs_and_stores_every_event() -> None:
    from tracehouse.bench.imports import bench_import_kineto

    result = bench_import_kineto(events=20_000, path=None)
    assert result["events"] == result["stored_events"] > 10_000
    assert result["json_load_events"] >= result["events"]
    assert result["importer_peak_rss_mb"] > 0 and result["ratio"] > 0
    # the floor stores the rows imported and counts the file's events, as the import's rate does
    floor, cpus = result["engine_floor"], result["machine"]["cpus"]
    assert floor["stored"] == floor["events"] == result["events"]
    per_file_event_us = floor["store_cpu_us_per_event"] * result["events"] / result["json_load_events"]
    assert floor["events_per_s_on_all_cores"] == pytest.approx(cpus * 1e6 / per_file_event_us, rel=0.05)
