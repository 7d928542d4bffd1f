"""Rollups of samples per 10 s and per minute: filled by materialized views, read by the
series query, and their answers equal the raw samples' answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from query import sql
from query.client import Client
from store import base, writes
from store.migrations import LATEST_VERSION, MIGRATIONS
from store.schema import Drop, Layout, render
from store.store import Store
from tests.helpers import MS, T0, S, request
from tracehouse.batch import BatchBuilder
from tracehouse.cli.serve import create_server
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.v1 import ingest_pb2_grpc

HOUR = 3600 * S


def _telemetry(seed: int = 5) -> pd.DataFrame:
    """Three hours of two GPUs' utilisation and one process's memory: ~10 Hz with jitter,
    a 20-minute gap, integer and fractional values, ns-precise times."""
    rng = np.random.default_rng(seed)
    ts = T0 + np.cumsum(rng.integers(50 * MS, 150 * MS, 110_000))
    ts = ts[(ts < T0 + HOUR) | (ts >= T0 + HOUR + 20 * 60 * S)]
    ts = ts[ts < T0 + 3 * HOUR]
    frames = [
        pd.DataFrame({"metric": "gpu.util", "gpu": gpu, "pid": 0, "ts": ts, "value": rng.integers(0, 101, ts.size)})
        for gpu in (0, 1)
    ]
    frames.append(
        pd.DataFrame({"metric": "proc.mem", "gpu": 0, "pid": 4242, "ts": ts, "value": rng.normal(5e9, 1e8, ts.size)})
    )
    return pd.concat(frames, ignore_index=True)


def _write(ingest: ingest_pb2_grpc.IngestStub, data: pd.DataFrame, batch_rows: int = 60_000) -> None:
    for i, lo in enumerate(range(0, len(data), batch_rows)):
        part = data.iloc[lo : lo + batch_rows]
        builder = BatchBuilder(f"tele-{i}", run_id="agent-1", host="host-a")
        for (metric, gpu, pid), rows in part.groupby(["metric", "gpu", "pid"]):
            builder.add_samples(
                str(metric), rows["ts"].to_numpy(), rows["value"].to_numpy(), gpu=int(gpu), pid=int(pid)
            )
        if i == 0:
            builder.add_run("agent-1", host="host-a", source="agent", start=T0)
        ingest.Write(request(builder), timeout=60)


@pytest.fixture
def telemetry(ingest: ingest_pb2_grpc.IngestStub) -> pd.DataFrame:
    data = _telemetry()
    _write(ingest, data)
    return data


def _oracle(data: pd.DataFrame, start: int, end: int, width: int) -> pd.DataFrame:
    inside = data[(data["ts"] >= start) & (data["ts"] < end)].copy()
    origin = start - start % width
    inside["bucket_start"] = origin + (inside["ts"] - origin) // width * width
    grouped = inside.groupby(["gpu", "pid", "metric", "bucket_start"])["value"]
    return grouped.agg(["min", "mean", "max", "count"]).reset_index()


def _check(frame: pd.DataFrame, expected: pd.DataFrame) -> None:
    got = frame.assign(bucket_start=[int(v.value) for v in frame["bucket_start"]])
    got = got.sort_values(["gpu", "pid", "metric", "bucket_start"]).reset_index(drop=True)
    expected = expected.sort_values(["gpu", "pid", "metric", "bucket_start"]).reset_index(drop=True)
    assert got["bucket_start"].tolist() == expected["bucket_start"].tolist()
    assert got["count"].tolist() == expected["count"].tolist()
    assert got["min"].tolist() == expected["min"].tolist()
    assert got["max"].tolist() == expected["max"].tolist()
    assert np.allclose(got["avg"], expected["mean"], rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    ("start", "end", "max_points"),
    [
        (T0, T0 + 3 * HOUR, 100),  # 2-minute buckets: the minute rollup
        (T0 + 1234 * MS, T0 + 2 * HOUR + 777 * MS, 600),  # edges inside a second: raw edges
        (T0 + 59 * S + 1, T0 + HOUR + 20 * S, 1000),  # 5 s buckets: raw samples
        (T0 + 7 * S + 1, T0 + 2 * HOUR + 3 * S, 300),  # 30 s buckets: the 10 s rollup
        (T0 + HOUR - 30 * S, T0 + HOUR + 25 * 60 * S, 50),  # across the gap
        (T0 + 10 * S + 3, T0 + 70 * S, 300),  # 200 ms buckets: raw samples only
    ],
)
def test_series_from_rollups_equals_raw(
    client: Client, telemetry: pd.DataFrame, start: int, end: int, max_points: int
) -> None:
    frame = client.series(["gpu.util", "proc.mem"], max_points=max_points, host="host-a", start=start, end=end)
    width = frame.attrs["bucket_ns"]
    assert width == sql.bucket_width(start, end, max_points)
    _check(frame, _oracle(telemetry, start, end, width))


def test_which_rollup_a_series_reads() -> None:
    minute = 60 * S
    assert sql.rollup_for(T0, T0 + 3 * HOUR, 2 * minute) == sql.Rollup(
        "samples_1m", -(-T0 // minute) * minute, (T0 + 3 * HOUR) // minute * minute
    )
    assert sql.rollup_for(T0 + 1, T0 + HOUR, 30 * S).table == "samples_10s"  # type: ignore[union-attr]
    assert sql.rollup_for(T0 + 1, T0 + HOUR, 5 * S) is None  # finer than the 10 s rollup
    assert sql.rollup_for(T0, T0 + 10 * S, 200 * MS) is None  # finer than a second
    assert sql.rollup_for(T0 + 1, T0 + S - 1, S) is None  # no whole second inside


def test_open_run_window_finds_the_exact_span(client: Client, telemetry: pd.DataFrame) -> None:
    """An open run: the data's span comes from the minute rollup, refined to the ns."""
    frame = client.series("gpu.util", max_points=400, run="agent-1", gpu=1)
    first, last = int(telemetry["ts"].min()), int(telemetry["ts"].max())
    width = frame.attrs["bucket_ns"]
    assert width == sql.bucket_width(first, last + 1, 400)
    _check(frame, _oracle(telemetry[telemetry["gpu"] == 1], first, last + 1, width))


def test_rollup_tables_hold_exact_aggregates_and_resends_count_once(
    store: Store, ingest: ingest_pb2_grpc.IngestStub, telemetry: pd.DataFrame
) -> None:
    _write(ingest, telemetry)  # every batch again: duplicates, stored once
    for table, span in sql.ROLLUPS:
        _check_rollup(store, table, span, telemetry)


def _check_rollup(store: Store, table: str, span: int, data: pd.DataFrame) -> None:
    """The rollup holds min, max, count and sum of `data` per series and `span`."""
    got = store.query(
        f"SELECT gpu, pid, metric, toUnixTimestamp64Nano(ts) AS bucket, min(min) AS lo, max(max) AS hi, "
        f"sum(count) AS n, sum(sum) AS total FROM {{db}}.{table} GROUP BY gpu, pid, metric, ts"
    ).to_pandas()
    expected = (
        data.assign(bucket=data["ts"] // span * span)
        .groupby(["gpu", "pid", "metric", "bucket"])["value"]
        .agg(lo="min", hi="max", n="count", total="sum")
        .reset_index()
    )
    merged = expected.merge(got, on=["gpu", "pid", "metric", "bucket"], how="outer", suffixes=("", "_got"))
    assert len(merged) == len(expected) == len(got)
    assert (merged["n"] == merged["n_got"]).all()
    assert (merged["lo"] == merged["lo_got"]).all() and (merged["hi"] == merged["hi_got"]).all()
    assert np.allclose(merged["total"], merged["total_got"], rtol=1e-12)


def test_migration_fills_rollups_from_samples_stored_before(
    store: Store, client: Client, telemetry: pd.DataFrame
) -> None:
    """A store at schema v1 (samples, no rollups) upgraded: the rollups are filled from
    the samples, and doing it twice counts nothing twice."""
    for table, _ in sql.ROLLUPS:
        store.execute(f"TRUNCATE TABLE {{db}}.{table}")
        store.execute(f"DROP VIEW IF EXISTS {{db}}.{table}_mv")  # a store at v1 had no views
    store.execute("TRUNCATE TABLE {db}.schema_migrations")
    store.execute("INSERT INTO {db}.schema_migrations (version, name) VALUES (1, 'v1')")
    assert store.migrate() == LATEST_VERSION
    store.execute("INSERT INTO {db}.schema_migrations (version, name) VALUES (1, 'v1')")
    store.execute("ALTER TABLE {db}.schema_migrations DELETE WHERE version = 2 SETTINGS mutations_sync = 1")
    assert store.migrate() == LATEST_VERSION
    total = store.query("SELECT sum(count) AS n FROM {db}.samples_1m").column("n")[0].as_py()
    assert total == len(telemetry)
    start, end = T0, T0 + 3 * HOUR
    frame = client.series("proc.mem", max_points=30, host="host-a", start=start, end=end)
    _check(frame, _oracle(telemetry[telemetry["metric"] == "proc.mem"], start, end, frame.attrs["bucket_ns"]))


@pytest.fixture
def short_lived(tmp_path: Path) -> Iterator[tuple[Store, Client, ingest_pb2_grpc.IngestStub]]:
    """Raw samples kept an hour, rollups for good."""
    import grpc

    store = Store.open(f"chdb://{tmp_path / 'store'}", DEFAULT_LIMITS, retention={"samples": 3600})
    server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        yield store, client, ingest_pb2_grpc.IngestStub(channel)
    channel.close()
    server.stop(5)
    store.close()


def test_rollups_outlive_raw_samples(short_lived: tuple[Store, Client, ingest_pb2_grpc.IngestStub]) -> None:
    """Samples past their retention are gone; a coarse series still answers from rollups."""
    store, client, ingest = short_lived
    data = _telemetry()
    _write(ingest, data)  # T0 lies months before today: past the hour
    store.execute("OPTIMIZE TABLE {db}.samples FINAL")
    assert store.query("SELECT count() AS n FROM {db}.samples").column("n")[0].as_py() == 0
    minute = 60 * S
    start, end = -(-T0 // minute) * minute, (T0 + 3 * HOUR) // minute * minute  # whole rollup rows
    frame = client.series("gpu.util", max_points=90, host="host-a", gpu=0, start=start, end=end)
    width = frame.attrs["bucket_ns"]
    assert width % (60 * S) == 0
    _check(frame, _oracle(data[(data["gpu"] == 0) & (data["metric"] == "gpu.util")], start, end, width))
    assert client.series("gpu.util", max_points=90, host="host-a", gpu=0, start=T0, end=T0 + 10 * S).empty


def test_a_half_written_batch_written_again_is_rolled_up_once(
    store: Store, ingest: ingest_pb2_grpc.IngestStub, telemetry: pd.DataFrame
) -> None:
    """The groups that stored the batches are left as a failure between the inserts and the ledger
    leaves them: no ledger rows, not marked done. Writing the batches again finishes the groups:
    their inserts again, whose views deduplicate with them."""
    store.execute("TRUNCATE TABLE {db}.ingest_batches")
    store.execute("DELETE FROM {db}.ingest_pending WHERE done = 1")
    store._done.clear()
    store._left_unfinished = store._unfinished_groups()  # what the store's only writer finds when it starts again
    assert store._left_unfinished
    _write(ingest, telemetry)
    assert store.query("SELECT count() AS n FROM {db}.samples").column("n")[0].as_py() == len(telemetry)
    for table, _ in sql.ROLLUPS:
        total = store.query(f"SELECT sum(count) AS n FROM {{db}}.{table}").column("n")[0].as_py()
        assert total == len(telemetry), table


def test_series_span_edges(client: Client, telemetry: pd.DataFrame) -> None:
    """Open windows whose one end falls inside a minute where no sample lies on that side."""
    first = int(telemetry["ts"].min())
    before_any = first - first % (60 * S) + 1  # inside the first minute, before its first sample
    assert client.series("gpu.util", max_points=100, host="host-a", end=before_any).empty
    assert client.series("gpu.util", max_points=100, host="host-a", start=int(telemetry["ts"].max()) + 1).empty
    end = first + 90 * S
    frame = client.series("gpu.util", max_points=100, host="host-a", gpu=0, end=end)
    util = telemetry[(telemetry["gpu"] == 0) & (telemetry["metric"] == "gpu.util")]
    _check(frame, _oracle(util, first, end, frame.attrs["bucket_ns"]))


def test_an_open_window_over_expired_raw_samples_answers_from_rollups(
    short_lived: tuple[Store, Client, ingest_pb2_grpc.IngestStub],
) -> None:
    store, client, ingest = short_lived
    data = _telemetry()
    _write(ingest, data)
    store.execute("OPTIMIZE TABLE {db}.samples FINAL")
    frame = client.series("gpu.util", max_points=30, host="host-a", gpu=1)
    minute = 60 * S
    assert frame["count"].sum() == len(data[(data["gpu"] == 1) & (data["metric"] == "gpu.util")])
    assert int(frame["bucket_start"].iloc[0].value) <= int(data["ts"].min()) // minute * minute


def test_an_upgrade_rolls_the_second_rollup_up_per_10_s_and_keeps_what_raw_samples_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of the previous version (schema v4, a rollup per second) whose first hour of raw samples
    --retention has taken, upgraded after a crash that came between migration 5's steps and its record:
    the 10 s rollup holds every sample once, from the rollup per second, which is then gone."""
    import grpc

    url = f"chdb://{tmp_path / 'store'}"
    data = _telemetry()
    with monkeypatch.context() as previous:
        previous.setattr(base, "MIGRATIONS", MIGRATIONS[:4])
        previous.setattr(base, "LATEST_VERSION", 4)
        previous.setattr(writes, "rollups", lambda samples: {})  # a server of v4: its views roll up
        with Store.open(url, DEFAULT_LIMITS) as old:
            server = create_server(old, "127.0.0.1:0", DEFAULT_LIMITS)
            with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                _write(ingest_pb2_grpc.IngestStub(channel), data)
            server.stop(5)
            hour = f"fromUnixTimestamp64Nano({T0 + HOUR})"
            old.execute(f"ALTER TABLE {{db}}.samples DELETE WHERE ts < {hour} SETTINGS mutations_sync = 1")
            assert old.query("SELECT count() AS n FROM {db}.samples_1s").column("n")[0].as_py() > 0
            for step in MIGRATIONS[4].steps:  # migration 5, not recorded: as if it crashed there
                for statement in render(step, old.layout):
                    old.execute(statement)
    with Store.open(url, DEFAULT_LIMITS) as store:
        assert store.schema_version() == LATEST_VERSION
        tables = store.query("SELECT name FROM system.tables WHERE database = 'tracehouse'").column(0).to_pylist()
        assert "samples_10s" in tables and "samples_1m" in tables
        assert not {"samples_1s", "samples_1s_mv", "samples_10s_mv", "samples_1m_mv"} & set(tables)
        _check_rollup(store, "samples_10s", 10 * S, data)
        codec = store.query(
            "SELECT compression_codec FROM system.columns WHERE database = 'tracehouse' AND table = 'samples' "
            "AND name = 'value'"
        )
        assert codec.column(0)[0].as_py() == "CODEC(Delta(8), ZSTD(9))"
        server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
        try:
            with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
                start, end = -(-T0 // (10 * S)) * 10 * S, T0 + HOUR - 10 * S  # whole 10 s rows, raw samples gone
                frame = client.series("proc.mem", max_points=150, host="host-a", start=start, end=end)
                assert frame.attrs["bucket_ns"] == 30 * S
                _check(frame, _oracle(data[data["metric"] == "proc.mem"], start, end, 30 * S))
        finally:
            server.stop(5)


def test_the_second_rollup_is_dropped_on_every_node() -> None:
    assert render(Drop("samples_1s"), Layout(cluster="c")) == [
        "DROP TABLE IF EXISTS `tracehouse`.samples_1s ON CLUSTER 'c' SYNC",
        "DROP TABLE IF EXISTS `tracehouse`.samples_1s_local ON CLUSTER 'c' SYNC",
    ]
    assert render(Drop("samples_1s_mv", view=True), Layout()) == ["DROP VIEW IF EXISTS `tracehouse`.samples_1s_mv SYNC"]
