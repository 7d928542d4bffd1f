"""User SQL: one query that only reads tracehouse's tables, run within the limits, on clients
of its own; the engine's refusals told as SqlRejected. The Store runs it (Store.user_sql).

The text runs as a subquery (sqlguard.wrap), so that only a query can run: readonly=1 alone
still lets `INTO OUTFILE` write files and `KILL QUERY` stop other people's queries. It runs
only once the engine's own parse of it passed sqlguard's allow-lists: readonly=1 alone still
lets `file()`, `url()`, dictionaries and system tables read.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError

from store import sqlguard
from store.location import StoreLocation
from store.sqlpositions import in_user_text
from store.storeerrors import SqlRejected, StoreUnavailable, clean_error, error_code
from tracehouse.model import Limits

# ClickHouse error codes that mean the user's SQL was refused, by what it asked for.
_READONLY = {164, 497}  # READONLY, ACCESS_DENIED
_TOO_LARGE = {158, 241, 396}  # TOO_MANY_ROWS, MEMORY_LIMIT_EXCEEDED, TOO_MANY_ROWS_OR_BYTES
_TIMEOUT = {159, 160}  # TIMEOUT_EXCEEDED, TOO_SLOW
_SYNTAX_ERROR = 62
_UNKNOWN_NAMES = {47, 60}  # UNKNOWN_IDENTIFIER, UNKNOWN_TABLE: the answer lists the real ones
_DESCRIBE = re.compile(r"\s*(DESCRIBE|DESC|SHOW|EXISTS)\b", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_HINT_COLUMNS = 64  # per table, in a refusal's list of columns
# Only the wording of an error depends on these: the engine and the subquery wrapping refuse.
_NOT_A_QUERY = re.compile(
    r"\b(INSERT|DROP|ALTER|TRUNCATE|CREATE|DELETE|UPDATE|RENAME|KILL|SYSTEM|OPTIMIZE|ATTACH|DETACH|GRANT|"
    r"REVOKE|SET|USE|EXCHANGE|UNDROP|INTO\s+OUTFILE)\b",
    re.IGNORECASE,
)
_COMMENTS = re.compile(r"(--[^\n]*|/\*.*?\*/)", re.DOTALL)
_AST_FORMAT = "TabSeparatedRaw"  # one EXPLAIN AST line a row, as the engine wrote it
_VERSION = re.compile(r"\s*\(version [^)]*\)")


class _NamesUnknown(SqlRejected):
    """A refusal for a name that is not there, or a statement that lists names (DESCRIBE): the
    store's real columns are added to it."""


class UserSql:
    """Runs users' SQL on a store's engine: at most sql_max_concurrent at once, each with its
    share of sql_max_memory_bytes. Each query gets clients of its own (from `connect`): the
    engine keeps settings per session, and readonly must not leak to writers."""

    def __init__(
        self, location: StoreLocation, limits: Limits, cluster: str, connect: Callable[[Mapping[str, Any]], Client]
    ) -> None:
        self.location = location
        self.limits = limits
        self._cluster = cluster
        self._connect = connect
        self._sql_slots = threading.BoundedSemaphore(max(1, limits.sql_max_concurrent))  # user SQL at once

    def run(self, sql: str, max_rows: int) -> tuple[bytes, int, bool]:
        """Returns (Arrow IPC stream, rows, truncated); the store is ready."""
        limits = self.limits
        max_rows = min(max_rows or limits.sql_max_rows, limits.sql_max_rows)
        text = sqlguard.wrap(sql)
        with self._user_sql_slot():
            started = time.monotonic()
            try:
                self._confine(text, sql, started)
                data = self._run_user_sql(text, sql, max_rows, started)
            except _NamesUnknown as error:  # the real names, with the refusal
                raise SqlRejected(error.reason, f"{error} {self._columns_hint(sql)}".strip()) from error
        if not data:
            return data, 0, False
        table = pa.ipc.open_stream(data).read_all()
        keep = min(max_rows, table.num_rows)
        if table.nbytes > limits.sql_max_bytes:
            keep = min(keep, int(table.num_rows * limits.sql_max_bytes / table.nbytes))
        if keep == table.num_rows:
            return data, keep, False
        return ipc_bytes(table.slice(0, keep)), keep, True

    def _columns_hint(self, sql: str) -> str:
        """The real columns of the store's tables that `sql` names (all its tables' names if none),
        with what start and end are: for a refusal that named a column or table that is not there."""
        settings = {"max_execution_time": self.limits.sql_max_seconds, "readonly": 1}
        try:
            client = self._connect(settings)
            try:
                found = client.query(
                    "SELECT table, name, type FROM system.columns WHERE database = {db:String} "
                    "AND NOT startsWith(table, '.') ORDER BY table, position",
                    parameters={"db": self.location.database},
                ).result_rows
            finally:
                client.close()
        except (ClickHouseError, OSError):
            return ""
        return columns_hint(sql, [(str(t), str(n), str(k)) for t, n, k in found])

    @contextlib.contextmanager
    def _user_sql_slot(self) -> Iterator[None]:
        """One of the sql_max_concurrent places for user SQL, waited for sql_queue_seconds at most."""
        if not self._sql_slots.acquire(timeout=self.limits.sql_queue_seconds):
            raise SqlRejected(
                "too_large",
                f"sql: {self.limits.sql_max_concurrent} queries are running, the most at once: try again shortly",
            )
        try:
            yield
        finally:
            self._sql_slots.release()

    def _confine(self, text: str, sql: str, started: float) -> None:
        """Refuse the text unless the engine's parse of it passes sqlguard; the parse is of the text
        that runs, with the format clause the client appends (only its name differs)."""
        settings = {"max_execution_time": self.limits.sql_max_seconds, "readonly": 1}
        with self._user_client(settings, sql, started, f"EXPLAIN AST {_head(text, sql)}") as client:
            dump = client.raw_query(f"EXPLAIN AST {text}", fmt=_AST_FORMAT)
            databases = [str(row[0]) for row in client.query("SELECT name FROM system.databases").result_rows]
        lines = dump.decode("utf-8", "replace").split("\n")
        if lines and not lines[-1]:
            lines.pop()
        reason = sqlguard.refusal(lines, _AST_FORMAT, self.location.database, databases)
        if reason:
            raise SqlRejected("readonly", reason)
        self._refuse_states(text, sql, started)

    def _refuse_states(self, text: str, sql: str, started: float) -> None:
        """Refuse a result whose columns, as the engine types them, hold aggregate function states."""
        settings = {"max_execution_time": self.limits.sql_max_seconds, "readonly": 1}
        with self._user_client(settings, sql, started, f"DESCRIBE TABLE ({_head(text, sql)}") as client:
            columns = client.query(f"DESCRIBE TABLE ({text})").result_rows
        reason = sqlguard.state_refusal((str(row[0]), str(row[1])) for row in columns)
        if reason:
            raise SqlRejected("invalid", reason)

    def _run_user_sql(self, text: str, sql: str, max_rows: int, started: float) -> bytes:
        limits = self.limits
        settings = {
            "max_execution_time": limits.sql_max_seconds,
            # the bound is on all user SQL together: each of the queries at once gets its share
            "max_memory_usage": limits.sql_max_memory_bytes // max(1, limits.sql_max_concurrent),
            "max_result_rows": max_rows + 1,
            # the engine stops past twice the limit; the cut to the limit is made here, so
            # that a result cut for its size is known to be cut
            "max_result_bytes": 2 * limits.sql_max_bytes,
            "result_overflow_mode": "break",
            # on a cluster: GLOBAL subqueries are refused under readonly; each shard runs its own
            **({"distributed_product_mode": "allow"} if self._cluster else {}),
            "readonly": 1,  # last: once set, the session may change no other setting
        }
        with self._user_client(settings, sql, started, _head(text, sql)) as client:
            return bytes(client.raw_query(text, fmt="ArrowStream"))

    @contextlib.contextmanager
    def _user_client(self, settings: Mapping[str, Any], sql: str, started: float, head: str) -> Iterator[Client]:
        """A client of its own for user SQL (the engine keeps settings per session, and readonly must
        not leak to writers), closed after; the engine's refusals as SqlRejected, their positions in
        `sql` (`head`: the text the engine sees before the user's)."""
        client = self._connect(settings)
        try:
            client.database = self.location.database
            yield client
        except DatabaseError as error:
            raise _sql_rejection(error, sql, self.limits, started, head) from error
        except ClickHouseError as error:
            raise StoreUnavailable(f"store {self.location.display}: {clean_error(error)}") from error
        finally:
            with contextlib.suppress(Exception):
                client.close()


def columns_hint(sql: str, columns: list[tuple[str, str, str]]) -> str:
    """'The columns of events: run_id String, …, start DateTime64(9, 'UTC'), …' for the tables that
    `sql` names (rows of (table, column, type)); the tables' names where it names none of them."""
    tables: dict[str, list[str]] = {}
    for table, name, kind in columns:
        tables.setdefault(table, []).append(f"{name} {kind}")
    words = {word.lower() for word in _WORD.findall(sql)}
    named = [table for table in tables if table.lower() in words]
    if not named:
        return f"The tables: {', '.join(sorted(tables))}." if tables else ""
    said = []
    for table in named:
        shown = tables[table][:MAX_HINT_COLUMNS]
        more = len(tables[table]) - len(shown)
        said.append(f"The columns of {table}: {', '.join(shown)}{f' and {more} more' if more > 0 else ''}.")
    if any("start DateTime64" in column for table in named for column in tables[table]):
        said.append("start and end are times, DateTime64(9): toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start) "
                    "AS duration_ns is a duration in ns.")  # fmt: skip
    return " ".join(said)


def ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _head(text: str, sql: str) -> str:
    """The wrapper's text before the user's: `text` is sqlguard.wrap(sql)."""
    return text[: len(text) - len(sql.strip().rstrip(";")) - len("\n)")]


def _sql_rejection(error: DatabaseError, sql: str, limits: Limits, started: float, head: str) -> SqlRejected:
    code = error_code(error)
    message = _VERSION.sub("", clean_error(error))
    if code == _SYNTAX_ERROR:
        message = in_user_text(message, sql, head)
    bare = _COMMENTS.sub(" ", sql)
    statement = _NOT_A_QUERY.search(bare) if code == _SYNTAX_ERROR else None
    if statement:
        verb = " ".join(statement.group(1).upper().split())
        return SqlRejected("readonly", f"read-only: only queries (SELECT, WITH) run here, not {verb}")
    if code in _READONLY:
        return SqlRejected("readonly", f"read-only: SQL here may only read data ({message})")
    if code in _TIMEOUT:
        return SqlRejected(
            "too_large",
            f"query ran past the {limits.sql_max_seconds:g} s limit ({time.monotonic() - started:.1f} s)",
        )
    if code in _TOO_LARGE:
        return SqlRejected("too_large", f"query exceeded a size limit: {message}")
    if code == _SYNTAX_ERROR and (describe := _DESCRIBE.match(bare)):
        message = f"sql: only queries (SELECT, WITH) run here, not {describe.group(1).upper()}."
    if code in _UNKNOWN_NAMES or message.startswith("sql: only queries"):
        return _NamesUnknown("invalid", message)
    return SqlRejected("invalid", message)
