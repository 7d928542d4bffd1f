"""The store seam: URLs and migrations."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.location import parse_store_url
from store.migrations import LATEST_VERSION
from store.store import Store
from store.storeerrors import StoreUnavailable
from tracehouse.model import DEFAULT_LIMITS


def test_store_urls() -> None:
    embedded = parse_store_url("chdb:///var/lib/th")
    assert (embedded.engine, embedded.dsn, embedded.database) == ("chdb", "chdb:///var/lib/th", "tracehouse")
    server = parse_store_url("https://reader:p%40ss@ch.example:8443/telemetry")
    assert (server.engine, server.database) == ("http", "telemetry")
    assert "p%40ss" not in server.display and "reader:***@ch.example:8443" in server.display
    assert parse_store_url("http://ch:8123").database == "tracehouse"


@pytest.mark.parametrize("url", ["chdb://", "postgres://x/y", "http:///nohost", "http://h:1/bad-name!"])
def test_bad_store_urls(url: str) -> None:
    with pytest.raises(ValueError):
        parse_store_url(url)


def test_migrations_apply_once_and_rerun_safely(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path}"
    first = Store.open(url, DEFAULT_LIMITS)
    try:
        assert first.schema_version() == LATEST_VERSION
        assert first.migrate() == LATEST_VERSION  # again: nothing to do, nothing breaks
        applied = first.query("SELECT version FROM {db}.schema_migrations ORDER BY version")["version"].to_pylist()
        assert applied == list(range(1, LATEST_VERSION + 1))
        tables = set(first.query("SELECT name FROM system.tables WHERE database = 'tracehouse'")["name"].to_pylist())
        assert {"runs", "devices", "samples", "events", "ingest_batches", "schema_migrations"} <= tables
        wide = first.query(
            "SELECT name FROM system.tables WHERE database = 'tracehouse' "
            "AND match(create_table_query, 'merge_selector_base = 20([^0-9]|$)') ORDER BY name"
        )["name"].to_pylist()
        assert wide == ["samples", "samples_10s", "samples_1m"]  # what a fleet inserts a part of every group
        with first._client() as raw:
            raw.command("INSERT INTO tracehouse.schema_migrations (version, name) VALUES (999, 'from the future')")
    finally:
        first.close()
    with pytest.raises(StoreUnavailable, match="newer than this tracehouse"):
        Store.open(url, DEFAULT_LIMITS)


def test_an_embedded_insert_stores_the_rows_as_given_once_per_token(tmp_path: Path) -> None:
    """store/arrowinsert.py: chDB reads the Arrow table in memory; the token in the statement holds,
    whatever its characters; rows the engine refuses are refused, not half stored."""
    import numpy as np
    import pyarrow as pa
    from clickhouse_connect.driver.exceptions import DatabaseError

    from store.arrowinsert import PYTHON_ROWS, insert_arrow

    count = PYTHON_ROWS
    codes = pa.array(np.arange(count, dtype=np.int32) % 2)
    rows = pa.table(
        {
            "x": pa.array(np.arange(count, dtype=np.uint64)[::-1]),
            "s": pa.DictionaryArray.from_arrays(codes, pa.array(["a", "b"])),
            "m": pa.array(
                [[("k", str(x))] if x % 3 == 0 else [] for x in range(count)], pa.map_(pa.string(), pa.string())
            ),
        }
    )
    with Store.open(f"chdb://{tmp_path}/store", DEFAULT_LIMITS) as store:
        store.ensure_ready()
        store.execute(
            "CREATE TABLE {db}.probe (x UInt64, s LowCardinality(String), m Map(String, String)) "
            "ENGINE = MergeTree ORDER BY x SETTINGS non_replicated_deduplication_window = 100"
        )
        with store._client() as client:
            for token in ("one", "one", "it's \\ two"):
                insert_arrow(client, "chdb", f"{store.db}.probe", rows, {"insert_deduplication_token": token})
            twice = pa.DictionaryArray.from_arrays(codes, pa.array(["a", "a"]))  # one string named twice
            with pytest.raises(DatabaseError, match="uplicat"):
                insert_arrow(client, "chdb", f"{store.db}.probe", rows.set_column(1, "s", twice))
        stored = store.query(
            "SELECT x, any(s) AS s, any(m['k']) AS k, count() AS n FROM {db}.probe GROUP BY x ORDER BY x"
        ).to_pylist()
    given = sorted((count - 1 - row, row) for row in range(count))  # (x, its row), as stored
    expected = [{"x": x, "s": "ab"[row % 2], "k": str(row) if row % 3 == 0 else "", "n": 2} for x, row in given]
    assert stored == expected


def test_a_group_of_event_batches_stores_each_ones_extras_as_sent(tmp_path: Path) -> None:
    """ingest/validate.py gives extras as codes into each batch's own dictionary: batches of one group,
    with extras and without, in dictionaries that differ, store each event's extras as sent, and the
    group's copy in ingest_pending reads back as the same rows."""
    from ingest.validate import validate_batch
    from store.group import decode_tables, encode_tables, new_group
    from tracehouse.batch import BatchBuilder

    t0 = 1_790_000_000_000_000_000
    sent = {
        "with": [{"grid": "1,2,3", "stream": "7"}, {}, {"block": "32"}],
        "without": None,
        "other": [{"zeta": "z"}, {"grid": "9"}, {}],
    }
    batches = []
    for i, (name, extras) in enumerate(sent.items()):
        builder = BatchBuilder(f"b-{name}", run_id="r", host="h")
        builder.add_events("kernel", [t0 + 10 * i, t0 + 10 * i + 1, t0 + 10 * i + 2], [t0 + 100] * 3,
                           [f"{name}-{row}" for row in range(3)], extras=extras, gpu=0)  # fmt: skip
        batches.append(validate_batch(builder.build(), DEFAULT_LIMITS, t0))
    group = new_group(batches, t0)
    assert decode_tables(encode_tables(group.tables))["events"].to_pylist() == group.tables["events"].to_pylist()
    with Store.open(f"chdb://{tmp_path}/store", DEFAULT_LIMITS) as store:
        outcomes = store.write_group(batches, t0)
        assert [outcome.duplicate for outcome in outcomes] == [False] * 3  # type: ignore[union-attr]
        stored = {
            row["name"]: dict(row["extras"]) for row in store.query("SELECT name, extras FROM {db}.events").to_pylist()
        }
    expected = {f"{name}-{row}": (extras or [{}] * 3)[row] for name, extras in sent.items() for row in range(3)}
    assert stored == expected
