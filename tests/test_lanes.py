"""The timeline's lanes, checked against a plain-Python quantization of the same events."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import grpc
import pytest

from query.client import Client, QueryFailed
from tests.helpers import request
from tests.timeline_trace import HOST, MS, PID, T0, US, Trace
from tracehouse.batch import BatchBuilder
from tracehouse.v1 import ingest_pb2_grpc

Lane = tuple[str, str, int, int, int, int, int]


def events_of(trace: Trace) -> list[tuple[Lane, str, int, int]]:
    rows: list[tuple[Lane, str, int, int]] = []
    for w in trace.work:
        rows.append((("gpu", HOST, w["gpu"], w["stream"], 0, 0, 0), w["name"], w["start"], w["end"]))
    for r in trace.ranges:
        rows.append((("nvtx", HOST, -1, -1, PID, r["tid"], r["depth"]), r["name"], r["start"], r["end"]))
    for s in trace.syncs:
        rows.append((("sync", HOST, s["gpu"], -1, PID, s["tid"], 0), "cudaDeviceSynchronize", s["start"], s["end"]))
    return rows


def quantize(trace: Trace, lo: int, hi: int, buckets: int) -> tuple[dict[tuple[Lane, int], dict[str, Any]], int]:
    width = -(-(hi - lo) // buckets)
    cells: dict[tuple[Lane, int], dict[str, Any]] = defaultdict(lambda: {"events": 0, "covered": defaultdict(int)})
    count = 0
    for lane, name, start, end in events_of(trace):
        if start >= hi or end < lo or (end == lo and end != start):
            continue
        count += 1
        s, e = max(start, lo), min(end, hi)
        for b in range((s - lo) // width, (max(e - 1, s) - lo) // width + 1):
            cell = cells[(lane, lo + b * width)]
            cell["events"] += 1
            cell["covered"][name] += max(0, min(e, lo + (b + 1) * width) - max(s, lo + b * width))
    return cells, count


@pytest.mark.parametrize("buckets", [1, 37, 1000])
def test_lanes_quantize_every_event_of_the_window(client: Client, traces: dict[str, Trace], buckets: int) -> None:
    trace = traces["r1"]
    lo = sorted(w["start"] for w in trace.work)[len(trace.work) // 3] + 3 * US  # inside some events
    hi = lo + 11 * MS + 7
    answer = client.lanes(buckets=buckets, run="r1", start=lo, end=hi)
    expected, count = quantize(trace, lo, hi, buckets)
    width = -(-(hi - lo) // buckets)
    assert answer.attrs == {"start_ns": lo, "bucket_ns": width, "buckets": buckets, "events": count, "truncated": False}
    got = {}
    for row in answer.itertuples(index=False):
        lane = (row.lane, row.host, row.gpu, row.stream, row.pid, row.tid, row.depth)
        got[(lane, row.bucket_start_ns)] = row
    assert set(got) == set(expected)
    for key, cell in expected.items():
        row = got[key]
        covered = cell["covered"]
        assert row.events == cell["events"]
        assert row.busy_ns == min(width, sum(covered.values()))
        assert covered[row.top_name] == max(covered.values())


def test_lanes_of_chosen_kinds_over_a_run(client: Client, traces: dict[str, Trace]) -> None:
    answer = client.lanes(kinds=["nvtx"], buckets=10, run="r2")
    assert set(answer["lane"]) == {"nvtx"}
    trace = traces["r2"]
    assert answer.attrs["start_ns"] == trace.start and answer.attrs["events"] == len(trace.ranges)
    assert answer.attrs["start_ns"] + 10 * answer.attrs["bucket_ns"] >= trace.end


def test_lanes_of_an_empty_window_are_empty(client: Client, traces: dict[str, Trace]) -> None:
    answer = client.lanes(run="r1", start=0, end=1000)
    assert answer.empty and answer.attrs["events"] == 0


@pytest.mark.parametrize(("arguments", "field"), [({"kinds": ["kernels"]}, "kinds"), ({"buckets": 100_001}, "buckets")])
def test_lanes_refuse_bad_requests(client: Client, arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(QueryFailed) as failure:
        client.lanes(**arguments)
    assert failure.value.code == grpc.StatusCode.INVALID_ARGUMENT and field in str(failure.value)


def test_lanes_of_a_window_outside_its_runs_span_are_empty(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    builder = BatchBuilder("short-b", run_id="short", host=HOST)
    builder.add_run("short", host=HOST, source="nsys", start=T0, end=T0 + MS)
    builder.add_events("kernel", [T0 + 5 * MS], [T0 + 6 * MS], "late", gpu=0, stream=7, pid=PID, tid=1)
    assert not ingest.Write(request(builder), timeout=30).duplicate
    answer = client.lanes(run="short", start=T0 + 4 * MS, end=T0 + 7 * MS)
    assert answer.empty and answer.attrs["events"] == 0
