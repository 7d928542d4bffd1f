"""Query over real gRPC against a real chDB store: windows, series, paging, summaries."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from query.client import Client, QueryFailed
from query.sql import page_token
from tests.helpers import MS, T0, S, request, telemetry, trace
from tracehouse.batch import BatchBuilder
from tracehouse.v1 import ingest_pb2_grpc, query_pb2


def ns(column: pd.Series) -> list[int]:
    return [int(v.value) for v in column]


@pytest.fixture
def telemetry_run(ingest: ingest_pb2_grpc.IngestStub) -> dict[str, np.ndarray]:
    """host-a GPU 0 'gpu.util' with irregular times over 10 minutes, plus neighbours to leave out."""
    rng = np.random.default_rng(3)
    ts = np.sort(T0 + rng.integers(0, 600 * S, 20_000))
    values = rng.normal(50, 20, ts.size)
    main = BatchBuilder("tele-main", run_id="agent-1", host="host-a")
    main.add_samples("gpu.util", ts, values, gpu=0)
    main.add_samples("gpu.util", ts, values + 1, gpu=1)
    main.add_samples("gpu.power_w", ts, values * 3, gpu=0)
    main.add_run("agent-1", host="host-a", source="agent", start=T0)
    ingest.Write(request(main), timeout=60)
    other = BatchBuilder("tele-other", run_id="agent-2", host="host-b")
    other.add_samples("gpu.util", ts, values + 1000, gpu=0)
    ingest.Write(request(other), timeout=60)
    return {"ts": ts, "value": values}


@pytest.mark.parametrize("max_points", [1, 7, 100, 1000, 5000])
def test_series_never_exceeds_max_points_and_buckets_are_exact(
    client: Client, telemetry_run: dict[str, np.ndarray], max_points: int
) -> None:
    frame = client.series("gpu.util", max_points=max_points, host="host-a", gpu=0)
    assert 0 < len(frame) <= max_points
    width = frame.attrs["bucket_ns"]
    assert width > 0
    ts, values = telemetry_run["ts"], telemetry_run["value"]
    starts = np.array(ns(frame["bucket_start"]))
    assert (starts % width == 0).all(), "buckets are aligned to their width"
    bucket = ts // width * width
    for row, start in zip(frame.itertuples(), starts, strict=True):
        inside = values[bucket == start]
        assert row.count == inside.size
        assert row.min == pytest.approx(inside.min())
        assert row.max == pytest.approx(inside.max())
        assert row.avg == pytest.approx(inside.mean())
    assert frame["count"].sum() == ts.size


def test_series_window_cuts_exactly(client: Client, telemetry_run: dict[str, np.ndarray]) -> None:
    ts = telemetry_run["ts"]
    start, end = int(ts[100]), int(ts[5000])
    frame = client.series("gpu.util", max_points=10, host="host-a", gpu=0, start=start, end=end)
    assert frame["count"].sum() == ((ts >= start) & (ts < end)).sum()


def test_series_of_several_gpus_and_metrics(client: Client, telemetry_run: dict[str, np.ndarray]) -> None:
    frame = client.series(["gpu.util", "gpu.power_w"], max_points=50)
    keys = set(frame[["host", "gpu", "metric"]].itertuples(index=False, name=None))
    assert keys == {
        ("host-a", 0, "gpu.util"),
        ("host-a", 1, "gpu.util"),
        ("host-a", 0, "gpu.power_w"),
        ("host-b", 0, "gpu.util"),
    }
    for _, one in frame.groupby(["host", "gpu", "metric"]):
        assert len(one) <= 50


def test_run_window_is_its_hosts_telemetry_during_the_run(
    client: Client, ingest: ingest_pb2_grpc.IngestStub, telemetry_run: dict[str, np.ndarray]
) -> None:
    ts = telemetry_run["ts"]
    start, end = int(ts[2000]), int(ts[3000])
    declared = BatchBuilder("declare").add_run("train-1", host="host-a", source="user", start=start, end=end)
    ingest.Write(request(declared), timeout=30)
    frame = client.series("gpu.util", max_points=1000, run="train-1")
    assert set(frame["host"]) == {"host-a"}
    assert frame.groupby("gpu")["count"].sum().to_dict() == {0: 1000, 1: 1000}


def test_relative_time_run_sees_only_its_own_rows(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    for run_id in ("nsys-old-1", "nsys-old-2"):
        builder = BatchBuilder(f"b-{run_id}", run_id=run_id, host="host-a")
        builder.add_samples("SM Active", np.arange(10) * MS, np.full(10, 1.0 if run_id.endswith("1") else 2.0), gpu=0)
        builder.add_run(run_id, host="host-a", source="nsys", start=0, end=10 * MS, relative_time=True)
        ingest.Write(request(builder), timeout=30)
    frame = client.series("SM Active", run="nsys-old-2")
    assert frame["count"].sum() == 10
    assert set(frame["avg"]) == {2.0}


def test_events_pages_cover_everything_once_in_order(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    builder = BatchBuilder("many-events", run_id="run-e", host="host-a")
    starts = T0 + np.repeat(np.arange(500), 5) * MS  # five events share every start
    builder.add_events("kernel", starts, starts + MS, [f"k{i % 7}" for i in range(starts.size)], gpu=0)
    ingest.Write(request(builder), timeout=30)
    pages = list(client.event_pages(page_size=333, run="run-e"))
    assert [len(p) for p in pages] == [333] * 7 + [169]
    every = pd.concat(pages)
    assert every["id"].is_unique
    assert len(every) == starts.size
    order = list(zip(ns(every["start"]), every["id"], strict=True))
    assert order == sorted(order)


def test_events_overlap_the_window_half_open(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    builder = BatchBuilder("edges", run_id="run-w", host="host-a")
    cases = {  # name: (start, end) against the window [T0 + 10 ms, T0 + 20 ms)
        "ends-at-from": (0, 10),
        "crosses-from": (5, 11),
        "inside": (12, 15),
        "covers": (0, 30),
        "starts-at-to": (20, 25),
        "instant-at-from": (10, 10),
        "instant-at-to": (20, 20),
        "after": (21, 22),
    }
    for name, (start, end) in cases.items():
        builder.add_events("nvtx", [T0 + start * MS], [T0 + end * MS], name)
    ingest.Write(request(builder), timeout=30)
    frame = client.events(start=T0 + 10 * MS, end=T0 + 20 * MS)
    assert set(frame["name"]) == {"crosses-from", "inside", "covers", "instant-at-from"}


def test_events_filters_and_extras(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    ingest.Write(request(trace("t-1")), timeout=30)
    ingest.Write(request(trace("t-2", run_id="run-b", host="host-b")), timeout=30)
    kernels = client.events(kinds=["kernel"], run="run-a")
    assert len(kernels) == 10 and set(kernels["kind"]) == {"kernel"} and set(kernels["run_id"]) == {"run-a"}
    assert list(kernels["duration_ns"]) == [i * MS for i in range(1, 11)]
    assert list(kernels["correlation_id"]) == list(range(10))
    steps = client.events(names=["train_step"], host="host-b")
    assert len(steps) == 1 and steps["extras"][0] == {"color": "red"} and steps["tid"][0] == 42
    assert len(client.events(gpu=0, limit=4)) == 4


def test_kernel_summary_matches_numpy(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    ingest.Write(request(trace("t-s")), timeout=30)
    extra = BatchBuilder("t-s2", run_id="run-a", host="host-a")
    extra.add_events("kernel", [T0, T0 + 100], [T0 + 7 * MS, T0 + 100 + 3 * MS], "relu", gpu=0)
    ingest.Write(request(extra), timeout=30)
    summary = client.summary("kernels", run="run-a")
    assert list(summary["name"]) == ["gemm", "relu"]
    gemm = np.arange(1, 11) * MS
    row = summary.iloc[0]
    assert row["instances"] == 10
    assert row["total_ns"] == gemm.sum()
    assert row["avg_ns"] == pytest.approx(gemm.mean())
    assert row["med_ns"] == pytest.approx(np.median(gemm))
    assert (row["min_ns"], row["max_ns"]) == (gemm.min(), gemm.max())
    assert row["stddev_ns"] == pytest.approx(gemm.std(ddof=1))
    assert row["time_pct"] == pytest.approx(100 * gemm.sum() / (gemm.sum() + 10 * MS))
    memops = client.summary("memops", run="run-a")
    assert memops.iloc[0]["total_ns"] == 3 * 2 * MS
    memsize = client.summary("memsize", run="run-a")
    assert memsize.iloc[0][["instances", "total_bytes", "med_bytes"]].tolist() == [3, 3 << 20, 1 << 20]
    nvtx = client.summary("nvtx", run="run-a")
    assert set(nvtx["name"]) == {"train_step", "checkpoint"}


def test_lists(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    batch = telemetry("l-1")
    batch.add_run("run-a", name="ResNet-50 bs256", host="host-a", source="user", start=T0, tags={"bs": "256"})
    batch.add_run("run-b", name="bert", host="host-b", source="nsys", start=T0 + S, end=T0 + 2 * S)
    batch.add_device("host-a", 0, uuid="GPU-aaa", name="H100", memory_total=80 << 30, sm_count=132)
    ingest.Write(request(batch), timeout=30)
    runs = client.runs()
    assert list(runs["run_id"]) == ["run-b", "run-a"], "newest first"
    assert runs["tags"][1] == {"bs": "256"}
    assert list(client.runs(name_contains="resnet")["run_id"]) == ["run-a"]
    assert list(client.runs(source="nsys")["run_id"]) == ["run-b"]
    devices = client.devices()
    assert devices.iloc[0][["uuid", "sm_count"]].tolist() == ["GPU-aaa", 132]
    metrics = client.metrics(gpu=1)
    assert set(metrics["metric"]) == {"gpu.util", "gpu.power_w"}
    assert set(metrics["samples"]) == {100}


@pytest.mark.parametrize(
    "call, code, field",
    [
        (lambda c: c.series("gpu.util", run="no-such-run"), "NOT_FOUND", "run"),
        (lambda c: c.series("gpu.util", start=T0 + 5, end=T0), "INVALID_ARGUMENT", "window.to_ns"),
        (lambda c: c.series("gpu.util", max_points=10**6), "INVALID_ARGUMENT", "max_points"),
        (lambda c: c.series([]), "INVALID_ARGUMENT", "metrics"),
        (lambda c: c.summary("kernelz"), "INVALID_ARGUMENT", "kind"),
        (lambda c: c.events(kinds=["kernal"]), "INVALID_ARGUMENT", "kinds"),
        (lambda c: c.series("gpu.util", gpu=[5000]), "INVALID_ARGUMENT", "window.gpus"),
        (lambda c: c.series("gpu.util", start=-2, end=5, max_points=1), "INVALID_ARGUMENT", "window.from_ns"),
        (lambda c: c.events(start=-(2**63), end=2**63 - 1), "INVALID_ARGUMENT", "window.from_ns"),
    ],
)
def test_bad_questions_get_clear_errors(client: Client, call, code: str, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(QueryFailed) as caught:
        call(client)
    assert caught.value.code.name == code
    assert caught.value.message.startswith(field) or field in caught.value.message


@pytest.mark.parametrize("token", ["not-a-token", page_token(0, -1), page_token(2**63, 1), page_token(1, 2**64)])
def test_forged_page_token_is_refused(client: Client, token: str) -> None:
    with pytest.raises(QueryFailed) as caught:
        client._call("Events", query_pb2.EventsRequest(page_token=token))
    assert caught.value.code.name == "INVALID_ARGUMENT" and "page_token" in caught.value.message


def test_a_window_as_wide_as_time_still_answers(client: Client, telemetry_run: dict[str, np.ndarray]) -> None:
    frame = client.series("gpu.util", host="host-a", gpu=0, start=0, end=2**63 - 1, max_points=1)
    assert len(frame) == 1 and frame["count"][0] == telemetry_run["ts"].size


def test_empty_store_answers_empty(client: Client) -> None:
    assert client.runs().empty
    assert client.series("gpu.util").empty
    assert client.events().empty
    assert client.summary("kernels").empty
