"""The store: the one place that owns ClickHouse clients.

The store URL decides the engine: `chdb://PATH` (embedded, in this process) or
`http(s)://user:password@host:port/database` (a ClickHouse server). Nothing outside the store
knows which one is behind it.

Store is built up in layers: store/base.py (connection, client pools, the reader gate, health,
migrations), store/writes.py (group commit, exactly once), and here the reads. Beside them:
store/location.py (the store URL), store/storeerrors.py (its errors), store/storefolder.py (the
embedded store's folder checks), store/usersql.py (users' SQL)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from store.location import parse_store_url
from store.storeerrors import StoreError
from store.writes import GroupWrites
from tracehouse.model import Limits

_MATERIALIZED_CTE = re.compile(r"\bAS MATERIALIZED \(")


class Store(GroupWrites):
    """Connects, migrates, writes batches exactly once, and runs queries."""

    @classmethod
    def open(cls, url: str, limits: Limits, database: str = "tracehouse", **layout: Any) -> Store:
        """Connect and migrate now; raises StoreUnavailable. `layout`: cluster, shards_by, retention."""
        store = cls(parse_store_url(url, database), limits, **layout)
        try:
            store.ensure_ready()
        except BaseException:
            store.close()
            raise
        return store

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        """Run one of tracehouse's own reads; `{db}` in the text names the database. At most
        query_max_concurrent at once, each within query_max_seconds and its share of
        query_max_memory_bytes: StoreBusy when no place frees soon, QueryTooLarge past a bound."""
        self.ensure_ready()
        if not self.materialized_cte:
            sql = without_materialized_cte(sql)
        with self._reader() as client:
            return client.query_arrow(sql.replace("{db}", self.db), parameters=dict(parameters or {}))

    def execute(self, sql: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Run one of tracehouse's own statements that answers nothing (the keeper's, benchmarks' fills):
        a write, on a writer's client."""
        self.ensure_ready()
        with self._client(failure=StoreError) as client:
            client.command(sql.replace("{db}", self.db), parameters=dict(parameters or {}))

    def append(self, table: str, data: pa.Table) -> None:
        """Insert a few rows of one of tracehouse's small tables (captures) as they are."""
        self.ensure_ready()
        with self._client(failure=StoreError) as client:
            self._insert_table(client, table, data)

    def user_sql(self, sql: str, max_rows: int) -> tuple[bytes, int, bool]:
        """Run a user's SQL: one query that only reads tracehouse's tables, within the limits.

        The text runs as a subquery (sqlguard.wrap), so that only a query can run: readonly=1 alone
        still lets `INTO OUTFILE` write files and `KILL QUERY` stop other people's queries. It runs
        only once the engine's own parse of it passed sqlguard's allow-lists: readonly=1 alone still
        lets `file()`, `url()`, dictionaries and system tables read. At most sql_max_concurrent run
        at once, each with its share of sql_max_memory_bytes. Returns (Arrow IPC stream, rows,
        truncated). Each query gets clients of its own: the engine keeps settings per session, and
        readonly must not leak to writers.
        """
        self.ensure_ready()
        return self._user_sql.run(sql, max_rows)


def without_materialized_cte(sql: str) -> str:
    """The query with its CTEs computed where referenced: same answer, maybe more work."""
    return _MATERIALIZED_CTE.sub("AS (", sql).replace("\nSETTINGS enable_materialized_cte = 1", "")
