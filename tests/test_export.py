"""`tracehouse export`: a window of a real Nsight run (CloverLeaf on A100s) with telemetry, as
Perfetto protobuf read back with Perfetto's published protos and as Chrome JSON read back with
tracehouse's own Kineto reader; the CLI end to end and its refusals."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from agent.traces.kineto import KinetoTrace
from query.client import Client
from query.export import fetch, window_trace
from query.export.chrome import us
from query.export.perfetto import perfetto_trace
from query.export.window import WindowData, layers
from tests.conftest import FIXTURES
from tests.helpers import MS, request, telemetry
from tracehouse.cli.main import main
from tracehouse.v1 import ingest_pb2_grpc

CLOVERLEAF = FIXTURES / "nsys" / "nsys-2024.5-pipit-cloverleaf-4xa100.sqlite"
needs_fixture = pytest.mark.skipif(not CLOVERLEAF.is_file(), reason=f"no {CLOVERLEAF}")
SAMPLES = 8  # per series, 100 ms apart, inside the run


@pytest.fixture
def run(address: str, ingest: ingest_pb2_grpc.IngestStub, client: Client) -> dict[str, Any]:
    """CloverLeaf imported, and telemetry of its host's GPUs 0 and 1 during it."""
    writer = BatchWriter(address, patience=10)
    try:
        result = import_export(CLOVERLEAF, writer)
    finally:
        writer.close()
    info = client.runs().set_index("run_id").loc[result.run_id]
    start = int(info["start"].value)
    ingest.Write(request(telemetry("export-t", result.run_id, result.host, SAMPLES, start + MS)), timeout=30)
    return {"run_id": result.run_id, "host": result.host, "start": start, "end": int(info["end"].value)}


def stored(client: Client, **window: Any) -> pd.DataFrame:
    """The window's events as the Query service answers them, times in ns."""
    events = client.events(page_size=100_000, **window)
    events = events[~events["kind"].isin(("process", "thread"))].copy()
    for column in ("start", "end"):
        events[column] = events[column].astype("int64")
    return events


def slices_of(trace: pb.Trace) -> tuple[list[tuple[str, int, int]], dict[int, str], list[tuple[int, int, float]]]:
    """(name, start, end) of every slice and instant, track names by uuid, (track, ts, value) of
    every counter value: the trace read as Perfetto's trace processor reads it."""
    names: dict[int, str] = {}
    tracks: dict[int, str] = {}
    open_: dict[int, list[tuple[str, int]]] = {}
    slices: list[tuple[str, int, int]] = []
    counters: list[tuple[int, int, float]] = []
    for packet in trace.packet:
        assert packet.trusted_packet_sequence_id == 1
        for entry in packet.interned_data.event_names:
            names[entry.iid] = entry.name
        if packet.HasField("track_descriptor"):
            track = packet.track_descriptor
            tracks[track.uuid] = track.name or track.process.process_name
        if not packet.HasField("track_event"):
            continue
        event = packet.track_event
        if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_.setdefault(event.track_uuid, []).append((names[event.name_iid], packet.timestamp))
        elif event.type == pb.TrackEvent.TYPE_SLICE_END:
            name, start = open_[event.track_uuid].pop()  # nested properly, or this fails
            slices.append((name, start, packet.timestamp))
        elif event.type == pb.TrackEvent.TYPE_INSTANT:
            slices.append((names[event.name_iid], packet.timestamp, packet.timestamp))
        else:
            assert event.type == pb.TrackEvent.TYPE_COUNTER
            counters.append((event.track_uuid, packet.timestamp, event.double_counter_value))
    assert not any(open_.values()), "a slice was never ended"
    return slices, tracks, counters


@needs_fixture
def test_perfetto_trace_holds_every_event_and_counter_of_the_window(run: dict[str, Any], client: Client) -> None:
    third = (run["end"] - run["start"]) // 3
    window = {"run": run["run_id"], "host": None, "start": run["start"] + third, "end": run["end"] - third}
    body = window_trace(client, **window, fmt="perfetto")
    trace = pb.Trace.FromString(body)
    slices, tracks, counters = slices_of(trace)

    events = stored(client, run=run["run_id"], start=window["start"], end=window["end"])
    assert len(events) > 1000
    expected = Counter(zip(events["name"], events["start"], events["end"], strict=True))
    assert Counter(slices) == expected  # every event, to the ns, and nothing else
    kernels = events[events["kind"] == "kernel"]
    assert kernels["start"].min() < window["end"] and (events["end"] >= window["start"]).all()

    names = set(tracks.values())
    assert "GPU 0 · stream 7" in names and "cuda-cloverleaf" in names
    assert any(name.startswith("cuda-cloverleaf (1701896) · CUDA API") for name in names)
    series = client.series(["gpu.util", "gpu.power_w"], max_points=100_000, start=window["start"], end=window["end"])
    assert len(series) and (series["count"] == 1).all()
    got = sorted((tracks[uuid], ts, value) for uuid, ts, value in counters)
    columns = (series[c] for c in ("gpu", "metric", "bucket_start", "avg"))
    want = sorted((f"GPU {gpu} · {metric}", int(at.value), avg) for gpu, metric, at, avg in zip(*columns, strict=True))
    assert got == want  # every value of the window, on a track per GPU and metric
    sampled = {(gpu, value) for gpu, value in zip(series["gpu"], series["avg"], strict=True)}
    power = {(gpu, 200.0 + gpu) for gpu in (0, 1)}
    assert power <= sampled

    units = {
        d.track_descriptor.name: d.track_descriptor.counter.unit_name
        for d in trace.packet
        if d.HasField("track_descriptor")
    }
    assert units["GPU 1 · gpu.power_w"] == "W"
    flows = Counter(f for p in trace.packet for f in p.track_event.flow_ids)
    ends = Counter(f for p in trace.packet for f in p.track_event.terminating_flow_ids)
    assert flows and flows == ends and set(flows.values()) == {1}  # each CUDA call to its GPU work


@needs_fixture
def test_chrome_json_reads_back_through_the_kineto_reader_to_the_ns(
    run: dict[str, Any], client: Client, tmp_path: Path
) -> None:
    path = tmp_path / "window.json"
    path.write_bytes(window_trace(client, run=run["run_id"], host=None, start=None, end=None, fmt="chrome"))
    document = json.loads(path.read_text())
    assert document["baseTimeNanoseconds"] == run["start"] or document["baseTimeNanoseconds"] > 0
    with KinetoTrace(path) as reader:
        table = pa.Table.from_batches([batch for part in reader.parts() for batch in part.chunks]).to_pandas()
    columns = ["name", "start", "end", "gpu", "stream", "correlation_id"]
    events = stored(client, run=run["run_id"])
    for kind in ("kernel", "memcpy", "cuda_api"):
        want = events[events["kind"] == kind][columns].sort_values(columns).reset_index(drop=True)
        got = table[table["kind"] == kind][columns].sort_values(columns).reset_index(drop=True)
        assert len(want) and got.astype(want.dtypes.to_dict()).equals(want), kind
    kernels = table[table["kind"] == "kernel"]
    assert (kernels["launch_start"] > 0).all()  # linked again to the call that launched each one
    counters = [e for e in document["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == 2 * 2 * SAMPLES and {e["name"] for e in counters} >= {"GPU 0 · gpu.power_w"}


@needs_fixture
def test_the_cli_writes_a_file_and_says_what_it_wrote(
    run: dict[str, Any], address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "run.json.gz"
    assert main(["export", "--server", address, "--run", run["run_id"], "-o", str(out)]) == 0
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "https://ui.perfetto.dev" in said[0] and "chrome" in said[0], said
    assert json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]

    out = folder / "run.pftrace"
    start = pd.Timestamp(run["start"], unit="ns", tz="UTC").isoformat()
    assert main(["export", "--server", address, "--run", run["run_id"], "--from", start, "-o", str(out)]) == 0
    assert "perfetto" in capsys.readouterr().err
    assert len(pb.Trace.FromString(out.read_bytes()).packet) > 1000
    assert sorted(p.name for p in folder.iterdir()) == ["run.json.gz", "run.pftrace"]  # no leftovers


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(argv)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return status, err


@needs_fixture
def test_refusals_are_one_line_and_write_nothing(
    run: dict[str, Any], address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "x.pftrace"
    base = ["export", "--server", address, "-o", str(out)]
    status, err = refused([*base, "--run", "no-such-run"], capsys)
    assert status == 2 and "no-such-run" in err and "NOT_FOUND" in err
    status, err = refused([*base, "--run", run["run_id"], "--from", "2001-01-01", "--to", "2001-01-02"], capsys)
    assert status == 1 and "nothing written" in err
    status, err = refused(
        ["export", "--server", address, "--run", run["run_id"], "-o", str(folder / "no" / "x")], capsys
    )
    assert status == 2 and "--output" in err and "No such file or directory" in err
    status, err = refused([*base[:-1], str(folder), "--run", run["run_id"]], capsys)
    assert status == 2 and "folder" in err
    status, err = refused([*base], capsys)
    assert status == 2 and "--run" in err
    assert list(folder.iterdir()) == []


# -- the pure parts -----------------------------------------------------------------------------


def test_times_in_microseconds_keep_every_ns() -> None:
    assert [us(0), us(7), us(1_234_567), us(10**15 + 1)] == ["0.000", "0.007", "1234.567", "1000000000000.001"]


def test_events_that_do_not_nest_go_to_a_further_track() -> None:
    # [0, 10) holds [2, 4); [5, 12) overlaps its end; [12, 13) and the instant at 6 nest anywhere
    starts, ends = np.array([0, 2, 5, 6, 12]), np.array([10, 4, 12, 6, 13])
    assert layers(starts, ends).tolist() == [0, 0, 1, 0, 0]
    events = pd.DataFrame(
        {
            "host": "h", "kind": "nvtx", "start": starts, "end": ends, "gpu": -1, "stream": -1, "pid": 9, "tid": 9,
            "name": ["a", "b", "c", "d", "e"], "correlation_id": 0, "bytes": 0, "extras": [{}] * 5,
        }
    )  # fmt: skip
    counters = pd.DataFrame(
        {"host": ["h"], "gpu": [0], "pid": [0], "metric": ["gpu.mem_used_bytes"], "ts": [3], "value": [1.5]}
    )
    slices, tracks, values = slices_of(pb.Trace.FromString(perfetto_trace(WindowData(events, counters))))
    assert sorted(slices) == sorted(zip(events["name"], starts.tolist(), ends.tolist(), strict=True))
    assert {"thread 9 (9) · NVTX", "thread 9 (9) · NVTX (2)", "GPU 0 · gpu.mem_used_bytes"} <= set(tracks.values())
    assert values == [(next(u for u, n in tracks.items() if n.endswith("bytes")), 3, 1.5)]


def test_fetch_of_an_empty_store_is_empty(client: Client) -> None:
    data = fetch(client, run=None, host=None, start=0, end=10**18)
    assert data.empty and perfetto_trace(data) == b""
