"""Arrow tables into the engine. An embedded store (chDB) reads a table of PYTHON_ROWS rows or more where
it lies in memory, through its Python() table function: the same rows as the Arrow format makes, for
0.1-0.4 µs of CPU less a row (no IPC file written and read back). A ClickHouse server, and any table of a
few rows, gets the Arrow format (clickhouse-connect's insert_arrow). Either way an insert of at most
INSERT_BLOCK_ROWS rows is one block, one part, and its deduplication token holds (tests/test_store.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from clickhouse_connect.driver.binding import format_str, quote_identifier
from clickhouse_connect.driver.client import Client

PYTHON_ROWS = 1024  # fewer go as the Arrow format: Python() costs 1-2 ms more to start (a ledger row: 9.2 ms, 7.6)


def insert_arrow(
    client: Client, engine: str, table: str, data: pa.Table, settings: Mapping[str, Any] | None = None
) -> None:
    """Insert `data` into `table` (database.name) as one block, with `settings` for the insert."""
    if engine != "chdb" or data.num_rows < PYTHON_ROWS:
        client.insert_arrow(table, data, settings=dict(settings or {}))
        return
    # chDB finds the table by this name among the calling frames' locals (no double underscore: a class
    # body would mangle it)
    tracehouse_insert_rows = data  # noqa: F841
    columns = ", ".join(quote_identifier(name) for name in data.column_names)
    # settings in the statement: clickhouse-connect would read, set and restore them (3 calls more, 3 ms)
    clause = ", ".join(
        f"{quote_identifier(name)} = {format_str(str(value))}" for name, value in (settings or {}).items()
    )
    client.command(
        f"INSERT INTO {table} ({columns}) SELECT * FROM Python(tracehouse_insert_rows)"
        + (f" SETTINGS {clause}" if clause else "")
    )
