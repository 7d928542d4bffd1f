"""Every answer is bounded in bytes, not only rows: a writer chooses how long its names are (issue 40).

Scaled down: answers of at most 1 MiB, 400 kernels with distinct 64 KiB names (26 MB of names)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from query.client import Client, QueryFailed
from query.export import window_trace
from tests.conftest import small_limits
from tests.helpers import T0, S, telemetry
from tracehouse.batch import BatchBuilder
from tracehouse.cli.main import main
from tracehouse.model import Limits
from tracehouse.v1 import ingest_pb2, ingest_pb2_grpc, query_pb2, query_pb2_grpc

BOUND = 1 << 20
SHOWN = 4 << 10
NAMES = 400
NAME_BYTES = 64 << 10


@pytest.fixture
def limits() -> Limits:
    return small_limits(max_answer_bytes=BOUND, max_shown_bytes=SHOWN)


def long_name(i: int) -> str:
    """Distinct names whose first 4 KiB are the same: only their ends tell them apart (é: 2 bytes, so the
    cut falls inside a character)."""
    return "é" * (NAME_BYTES // 2 - 8) + f"{i:08d}"


@pytest.fixture
def stored(ingest: ingest_pb2_grpc.IngestStub) -> list[str]:
    names = [long_name(i) for i in range(NAMES)]
    starts = T0 + np.arange(NAMES, dtype=np.int64) * 1000
    batch = BatchBuilder("long-names", run_id="long", host="h").add_events("kernel", starts, starts + 500, names, gpu=0)
    ingest.Write(ingest_pb2.WriteRequest(batch=batch.build()), timeout=60)
    return names


@pytest.fixture
def query(channel: grpc.Channel) -> query_pb2_grpc.QueryStub:
    return query_pb2_grpc.QueryStub(channel)


def test_events_pages_end_at_the_bound_and_cover_every_event_once(
    query: query_pb2_grpc.QueryStub, stored: list[str]
) -> None:
    request = query_pb2.EventsRequest(window=query_pb2.Window(run_id="long"), page_size=1000)
    sizes, names, ids = [], [], []
    while True:
        answer = query.Events(request, timeout=30)
        sizes.append(answer.ByteSize())
        names += [answer.dictionary[code] for code in answer.events.name]
        ids += list(answer.events.id)
        if not answer.next_page_token:
            break
        request.page_token = answer.next_page_token
    assert max(sizes) <= BOUND, "each page ends where its bytes reach the bound"
    assert len(sizes) >= NAMES * NAME_BYTES // BOUND, "so the events take several pages"
    assert len(ids) == len(set(ids)) == NAMES, "paging through returns every event exactly once"
    assert names == stored, "whole names, in start order"


def test_a_page_holds_one_event_whatever_its_size(stored: list[str], store: Any) -> None:
    from query.service import QueryService

    service = QueryService(store)
    object.__setattr__(service, "limits", small_limits(max_answer_bytes=1))
    answer = service.Events(query_pb2.EventsRequest(window=query_pb2.Window(run_id="long"), page_size=5), None)
    assert len(answer.events.id) == 1 and answer.next_page_token, "a bound below one event still pages"


def _shown_ok(names: list[str]) -> None:
    for name in names:
        assert len(name.encode()) <= SHOWN + len("…".encode())
        assert name.endswith("…") and name[:-1] == "é" * len(name[:-1]), "cut on a character boundary"


def test_kernel_summary_groups_whole_names_and_answers_them_cut(client: Client, stored: list[str]) -> None:
    summary = client.summary("kernels", run="long")
    assert summary.attrs["truncated"], "the rows that fit in the bound, and the answer says so"
    assert 0 < len(summary) < NAMES
    assert (summary["instances"] == 1).all(), "names alike in their first 4 KiB are still different kernels"
    assert summary["name_cut"].all()
    _shown_ok(summary["name"].tolist())
    top = client.summary("kernels", limit=3, run="long")
    assert len(top) == 3 and not top.attrs["truncated"]


def test_summary_answer_stays_within_the_bound(query: query_pb2_grpc.QueryStub, stored: list[str]) -> None:
    answer = query.Summary(query_pb2.SummaryRequest(window=query_pb2.Window(run_id="long"), kind="kernels"), timeout=30)
    assert answer.ByteSize() <= BOUND and answer.truncated


def test_lanes_answer_top_names_cut_within_the_bound(
    query: query_pb2_grpc.QueryStub, client: Client, stored: list[str]
) -> None:
    request = query_pb2.LanesRequest(window=query_pb2.Window(run_id="long"), buckets=NAMES)
    answer = query.Lanes(request, timeout=30)
    assert answer.ByteSize() <= BOUND and answer.lanes.truncated
    lanes = client.lanes(buckets=NAMES, run="long")
    assert lanes.attrs["truncated"] and 0 < len(lanes) < NAMES
    assert lanes["top_name_cut"].all()
    _shown_ok(lanes["top_name"].tolist())
    whole = client.lanes(buckets=10, run="long")
    assert not whole.attrs["truncated"] and whole["events"].sum() == NAMES


@pytest.fixture
def sized(client: Client) -> Iterator[list[tuple[str, int]]]:
    """The byte size of each answer the client gets."""
    seen: list[tuple[str, int]] = []
    call = client._call

    def measured(method: str, request: Any, stub: Any = None) -> Any:
        answer = call(method, request, stub)
        seen.append((method, answer.ByteSize()))
        return answer

    client._call = measured  # type: ignore[method-assign]
    yield seen


def test_export_pages_within_the_bound_and_keeps_whole_names(
    client: Client, sized: list[tuple[str, int]], stored: list[str]
) -> None:
    trace = window_trace(client, run="long", host=None, start=None, end=None)
    assert all(size <= BOUND for _, size in sized), sized
    assert sum(method == "Events" for method, _ in sized) > 1
    assert all(name.encode() in trace for name in stored[:: NAMES // 8]), "the trace has the whole names"


def test_cli_summary_marks_cut_names(capsys: pytest.CaptureFixture[str], address: str, stored: list[str]) -> None:
    assert main(["query", "kernels", "--server", address, "--run", "long", "--format", "csv", "--limit", "2"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 2 and all(row["name_cut"] == "True" for row in rows)
    _shown_ok([row["name"] for row in rows])
    assert main(["query", "kernels", "--server", address, "--run", "long"]) == 0
    out, err = capsys.readouterr()
    assert "…" in out and "truncated" in err and "cut" not in out.split("\n", 1)[0], err


def test_an_answer_its_query_does_not_bound_is_refused_naming_the_limit(
    client: Client, ingest: ingest_pb2_grpc.IngestStub, stored: list[str]
) -> None:
    starts = T0 + np.arange(NAMES, dtype=np.int64) * 1000
    batch = BatchBuilder("again", run_id="again", host="h").add_events("kernel", starts, starts + 900, stored, gpu=0)
    ingest.Write(ingest_pb2.WriteRequest(batch=batch.build()), timeout=60)
    with pytest.raises(QueryFailed) as refused:
        client.diff("long", "again")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"one answer holds at most {BOUND}" in refused.value.message
    assert len(client.diff("long", "again", limit=3)) == 3, "fewer rows are answered"


def test_runs_whose_attributes_outgrow_an_answer_are_refused_naming_the_limit(
    client: Client, ingest: ingest_pb2_grpc.IngestStub
) -> None:
    attrs = {f"a{i}": "x" * NAME_BYTES for i in range(BOUND // NAME_BYTES // 2)}
    batch = BatchBuilder("runs", host="h")
    for run in ("r1", "r2", "r3"):
        batch.add_run(run, host="h", start=T0, attrs=attrs)
    ingest.Write(ingest_pb2.WriteRequest(batch=batch.build()), timeout=60)
    with pytest.raises(QueryFailed) as refused:
        client.runs()
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"one answer holds at most {BOUND}" in refused.value.message
    assert len(client.runs(limit=1)) == 1, "fewer runs are answered"


def test_series_whose_points_outgrow_an_answer_are_refused_naming_the_limit(
    client: Client, ingest: ingest_pb2_grpc.IngestStub
) -> None:
    ingest.Write(ingest_pb2.WriteRequest(batch=telemetry("points", run_id="tele", n=20_000).build()), timeout=60)
    window = {"host": "host-a", "start": T0, "end": T0 + 2_000 * S}
    with pytest.raises(QueryFailed) as refused:
        client.series("gpu.util", max_points=20_000, **window)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"one answer holds at most {BOUND}" in refused.value.message
    assert len(client.series("gpu.util", max_points=1000, **window)) == 2000, "fewer points are answered"
