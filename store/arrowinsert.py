"""Arrow tables into the engine. An embedded store (chDB) reads the table where it lies in memory,
through its Python() table function: the same rows as the Arrow format sent over the wire make, for
0.3-0.4 µs of CPU less a row (no IPC file written and read back: `tracehouse bench ingest` and
`bench import` measure it). A ClickHouse server gets the Arrow format over HTTP (clickhouse-connect's
insert_arrow). Either way one insert of at most INSERT_BLOCK_ROWS rows is one block, one part, and the
insert's deduplication token holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from clickhouse_connect.driver.binding import quote_identifier
from clickhouse_connect.driver.client import Client


def insert_arrow(
    client: Client, engine: str, table: str, data: pa.Table, settings: Mapping[str, Any] | None = None
) -> None:
    """Insert `data` into `table` (database.name) as one block, with `settings` for the insert."""
    if engine != "chdb":
        client.insert_arrow(table, data, settings=dict(settings or {}))
        return
    # chDB finds the table by this name among the calling frames' locals (no double underscore: a class
    # body would mangle it)
    tracehouse_insert_rows = data  # noqa: F841
    columns = ", ".join(quote_identifier(name) for name in data.column_names)
    client.command(
        f"INSERT INTO {table} ({columns}) SELECT * FROM Python(tracehouse_insert_rows)", settings=dict(settings or {})
    )
