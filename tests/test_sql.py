"""Read-only SQL: the engine's own enforcement, limits on time and size, writes unharmed
(what user SQL may reach at all: tests/test_sql_confinement.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from query.client import Client, QueryFailed
from store.store import Store
from tests.conftest import small_limits
from tests.helpers import counts, request, telemetry
from tracehouse.model import Limits
from tracehouse.v1 import ingest_pb2_grpc

SLOW = "SELECT count() FROM numbers(100000000000)"


@pytest.fixture
def limits() -> Limits:
    return small_limits(sql_max_seconds=1.5, sql_max_rows=1000, sql_max_bytes=200_000)


@pytest.fixture
def loaded(ingest: ingest_pb2_grpc.IngestStub) -> Iterator[None]:
    ingest.Write(request(telemetry("sql-1")), timeout=30)
    yield


def test_select_returns_a_typed_table(client: Client, loaded: None) -> None:
    frame = client.sql(
        "SELECT gpu, metric, count() AS n, max(ts) AS last FROM samples GROUP BY gpu, metric ORDER BY 1, 2"
    )
    assert frame.to_dict("list") | {"last": None} == {
        "gpu": [0, 0, 1, 1],
        "metric": ["gpu.power_w", "gpu.util", "gpu.power_w", "gpu.util"],
        "n": [100, 100, 100, 100],
        "last": None,
    }
    assert str(frame["last"].dtype).startswith("datetime64[ns")


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE samples",
        "INSERT INTO samples SELECT * FROM samples",
        "ALTER TABLE samples DELETE WHERE 1",
        "TRUNCATE TABLE events",
        "CREATE TABLE x (a Int32) ENGINE = Memory",
        "/* a comment first */ DROP TABLE samples",
        "with x as (select 1) insert into samples select * from samples",
    ],
)
def test_anything_but_reading_is_refused_and_writes_keep_working(
    client: Client, ingest: ingest_pb2_grpc.IngestStub, store: Store, loaded: None, statement: str
) -> None:
    before = counts(store)
    with pytest.raises(QueryFailed) as caught:
        client.sql(statement)
    assert caught.value.code.name == "PERMISSION_DENIED"
    assert "read-only" in caught.value.message
    assert counts(store) == before
    assert not ingest.Write(request(telemetry("sql-after", n=10)), timeout=30).duplicate
    assert counts(store)["samples"] == before["samples"] + 40


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT 'pwned' INTO OUTFILE '{path}'",
        "SELECT 'pwned' INTO OUTFILE '{path}' APPEND",
        "SELECT 'pwned' INTO OUTFILE '{path}' TRUNCATE",
        "KILL QUERY WHERE 1 SYNC",
        "SYSTEM STOP MERGES",
        "SET readonly = 0",
    ],
)
def test_statements_that_are_not_queries_are_refused(client: Client, tmp_path: Path, statement: str) -> None:
    """readonly=1 alone lets INTO OUTFILE write files and KILL stop other queries."""
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    with pytest.raises(QueryFailed) as caught:
        client.sql(statement.format(path=target))
    assert caught.value.code.name in ("INVALID_ARGUMENT", "PERMISSION_DENIED")
    assert target.read_text() == "precious\n"
    assert not (tmp_path / "outfile.txt").exists()


def test_a_second_statement_is_refused(client: Client, store: Store, loaded: None) -> None:
    with pytest.raises(QueryFailed) as caught:
        client.sql("SELECT 1; DROP TABLE samples")
    assert caught.value.code.name == "PERMISSION_DENIED"
    assert counts(store)["samples"] == 400


def test_settings_in_the_sql_cannot_lift_the_limits(client: Client) -> None:
    for text in (f"{SLOW} SETTINGS max_execution_time = 1000", f"SELECT * FROM ({SLOW} SETTINGS readonly = 0)"):
        with pytest.raises(QueryFailed) as caught:
            client.sql(text)
        assert caught.value.code.name == "PERMISSION_DENIED" and "SETTINGS is not allowed" in caught.value.message


def test_time_limit(client: Client) -> None:
    with pytest.raises(QueryFailed) as caught:
        client.sql(SLOW)
    assert caught.value.code.name == "RESOURCE_EXHAUSTED"
    assert "1.5 s limit" in caught.value.message


def test_result_cut_for_its_size_says_so(client: Client) -> None:
    frame = client.sql("SELECT repeat('x', 1000) AS s FROM numbers(900)")
    assert 0 < len(frame) < 900 and frame.attrs["truncated"]
    assert frame.memory_usage(deep=True).sum() < 2 * 200_000 + 100_000


def test_result_is_truncated_at_max_rows(client: Client) -> None:
    frame = client.sql("SELECT number FROM numbers(100000)")
    assert len(frame) == 1000 and frame.attrs["truncated"]
    frame = client.sql("SELECT number FROM numbers(100000)", max_rows=10)
    assert list(frame["number"]) == list(range(10)) and frame.attrs["truncated"]
    frame = client.sql("SELECT number FROM numbers(10)")
    assert len(frame) == 10 and not frame.attrs["truncated"]


def test_syntax_errors_and_unknown_tables_are_invalid_argument(client: Client) -> None:
    for text, needle in (("SELEKT 1", "Syntax error"), ("SELECT * FROM nope", "nope")):
        with pytest.raises(QueryFailed) as caught:
            client.sql(text)
        assert caught.value.code.name == "INVALID_ARGUMENT"
        assert needle in caught.value.message


def test_empty_sql_is_refused(client: Client) -> None:
    with pytest.raises(QueryFailed) as caught:
        client.sql("   ")
    assert caught.value.code.name == "INVALID_ARGUMENT" and caught.value.message.startswith("sql")


def test_syntax_error_positions_are_in_the_users_own_text(client: Client) -> None:
    """The engine counts positions in the text it parses, the user's query wrapped in the tool's
    own; the message counts them in the user's text, lines and columns from 1."""
    query = "  SELECT\n  kind,\n  count( FROM events\nGROUP BY kind"
    at = query.index("events")
    assert (at + 1, query.count("\n", 0, at) + 1, at - query.rfind("\n", 0, at)) == (32, 3, 15)
    cases = {
        query: "Syntax error: failed at position 32 (events) (line 3, col 15): events",
        "SELECT 1\n\nFROM samples LIMT 5": "failed at position 29 (5) (line 3, col 19): 5",
        "\n\n  SELECT 'abc": "failed at position 12 ('abc…) (line 3, col 10)",
    }
    for text, wanted in cases.items():
        with pytest.raises(QueryFailed) as caught:
            client.sql(text)
        assert caught.value.code.name == "INVALID_ARGUMENT" and wanted in caught.value.message, caught.value.message

    with pytest.raises(QueryFailed) as caught:  # the tool's closing lines, and its own opening bracket
        client.sql("SELECT 1 FROM samples WHERE (((")
    message = caught.value.message
    assert "failed at the end of the query" in message and "FORMAT" not in message, message
    assert "'(' at position 29 (line 1, col 29)" in message, message
    assert {int(n) for n in re.findall(r"position (\d+)", message)} <= {29, 30, 31}, "the user's brackets only"
