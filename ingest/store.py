"""The store: the one module that owns ClickHouse clients.

The store URL decides the engine: `chdb://PATH` (embedded, in this process) or
`http(s)://user:password@host:port/database` (a ClickHouse server). Nothing outside this
module knows which one is behind it.

Beside it: ingest/location.py (the store URL), ingest/storeerrors.py (its errors),
ingest/storefolder.py (the embedded store's folder checks), ingest/usersql.py (users' SQL);
their names that callers use are importable from here.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError, OperationalError

from ingest.location import StoreLocation, parse_store_url, with_password
from ingest.migrations import LATEST_VERSION, LEDGER, MIGRATIONS, TABLES_BY_NAME
from ingest.schema import Layout, render, retention_ddl, ttl_expression
from ingest.storeerrors import (
    BatchConflict,
    BatchRefused,
    SqlRejected,
    StoreError,
    StoreNotWritable,
    StoreUnavailable,
    clean_error,
    error_code,
)
from ingest.storefolder import held_by_another_process, not_writable
from ingest.usersql import UserSql, ipc_bytes
from ingest.validate import ValidatedBatch
from tracehouse.model import Limits

__all__ = [
    "TABLES",
    "BatchConflict",
    "BatchRefused",
    "SqlRejected",
    "Store",
    "StoreError",
    "StoreLocation",
    "StoreNotWritable",
    "StoreUnavailable",
    "WriteResult",
    "ipc_bytes",
    "parse_store_url",
    "with_password",
    "without_materialized_cte",
]

log = logging.getLogger(__name__)

TABLES = ("samples", "events", "runs", "devices")
# Codes with which the engine refuses an insert for what its rows hold: the batch, not the store, is wrong.
_BAD_DATA = {
    6, 27, 38, 41, 53, 69, 70, 72,  # CANNOT_PARSE_*, TYPE_MISMATCH, ARGUMENT_OUT_OF_BOUND, CANNOT_CONVERT_TYPE
    117, 131, 190, 321, 349,  # INCORRECT_DATA, TOO_LARGE_STRING_SIZE, SIZES_OF_ARRAYS_DONT_MATCH, out of range, NULL
}  # fmt: skip
# How an engine says that its files refuse writes: READONLY disk or table, no space, or the OS's errno.
_NOT_WRITABLE_CODES = {242, 243}  # TABLE_IS_READ_ONLY, NOT_ENOUGH_SPACE
_NOT_WRITABLE_TEXT = re.compile(r"Read-only file system|Permission denied|Operation not permitted|No space left")
_MATERIALIZED_CTE = re.compile(r"\bAS MATERIALIZED \(")


@dataclass(frozen=True)
class WriteResult:
    duplicate: bool
    rows: Mapping[str, int]


class _ClientPool:
    """A few clients shared by threads; a client that failed is closed and replaced,
    since a failed query can leave unread data on its connection."""

    def __init__(self, connect: Any, size: int) -> None:
        self._connect = connect
        self._idle: queue.LifoQueue[Client] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._all: set[Client] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def client(self) -> Iterator[Client]:
        with self._slots:
            try:
                client = self._idle.get_nowait()
            except queue.Empty:
                client = self._connect()
                with self._lock:
                    self._all.add(client)
            try:
                yield client
            except ClickHouseError:
                self._discard(client)
                raise
            finally:
                if client in self._all:
                    self._idle.put(client)

    def _discard(self, client: Client) -> None:
        with self._lock:
            self._all.discard(client)  # not put back: the finally clause sees it gone
        with contextlib.suppress(Exception):
            client.close()

    def close(self) -> None:
        with self._lock:
            clients, self._all = list(self._all), set()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()


class Store:
    """Connects, migrates, writes batches exactly once, and runs queries."""

    def __init__(
        self,
        location: StoreLocation,
        limits: Limits,
        pool_size: int = 4,
        cluster: str = "",
        shards_by: str = "host",
        retention: Mapping[str, int] | None = None,
    ) -> None:
        self.location = location
        self.limits = limits
        self.layout = Layout(location.database, cluster, shards_by, dict(retention or {}))
        self.db = self.layout.db
        self._pool = _ClientPool(self._connect, pool_size)
        self._in_flight: set[str] = set()
        self._in_flight_changed = threading.Condition()
        self._ready = False
        self._ready_lock = threading.Lock()
        # WITH x AS MATERIALIZED: ClickHouse 26.1 and newer, and not yet reliable over Distributed
        self.materialized_cte = False
        self._closed = False
        self._user_sql = UserSql(location, limits, self.layout.cluster, self._connect)
        self._fault: StoreNotWritable | None = None  # while the folder refuses writes
        self._listeners: list[Callable[[bool], None]] = []
        self._health_lock = threading.Lock()

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

    def ensure_ready(self) -> None:
        """Migrate on first use; until that succeeds every call raises StoreUnavailable, as it does
        while the embedded store's folder refuses writes."""
        if self._fault is not None:
            self._recheck_folder()
        if self._ready:
            return
        with self._ready_lock:
            if not self._ready:
                self.migrate()
                self.materialized_cte = not self.layout.cluster and self._has_setting("enable_materialized_cte")
                self._ready = True
        self._health_changed()

    @property
    def healthy(self) -> bool:
        return self._ready and self._fault is None

    def on_health(self, listener: Callable[[bool], None]) -> None:
        """`listener(healthy)` is told when the store becomes ready, fails for good or recovers."""
        self._listeners.append(listener)

    def _health_changed(self) -> None:
        healthy = self.healthy
        for listener in self._listeners:
            listener(healthy)

    def _folder(self) -> Path | None:
        return Path(self.location.dsn[len("chdb://") :]) if self.location.engine == "chdb" else None

    def _not_writable(self) -> StoreNotWritable | None:
        """Whether the embedded store's folder takes a new file, now (a file made and removed)."""
        folder = self._folder()
        return None if folder is None else not_writable(folder)

    def _folder_fault(self, fault: StoreNotWritable) -> StoreNotWritable:
        with self._health_lock:
            first, self._fault = self._fault is None, fault
        if first and self._ready:  # before, it is the caller's to say (serve exits naming it)
            log.error("%s: health NOT_SERVING, calls UNAVAILABLE until it is", fault.for_operator())
        if first:
            self._health_changed()
        return fault

    def _recheck_folder(self) -> None:
        fault = self._not_writable()
        if fault is not None:
            raise self._folder_fault(fault)
        with self._health_lock:
            recovered, self._fault = self._fault is not None, None
        if recovered:
            log.info("the store folder %s is writable again: serving", self._folder())
            self._health_changed()

    def _held_by_another_process(self) -> bool:
        """Whether another process holds the embedded store's lock (the engine's `status` file)."""
        folder = self._folder()
        return folder is not None and held_by_another_process(folder)

    def _has_setting(self, name: str) -> bool:
        with self._client() as client:
            found = client.query(
                "SELECT count() FROM system.settings WHERE name = {name:String}", parameters={"name": name}
            )
            return bool(found.result_rows[0][0])

    def _connect(self, settings: Mapping[str, Any] | None = None) -> Client:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        if self.layout.cluster:
            # IN and JOIN over Distributed tables read the right side once, on this node
            settings = {"distributed_product_mode": "global", "distributed_foreground_insert": 1, **(settings or {})}
        fault = self._not_writable()  # the engine would fail to start, and say only that
        if fault is not None:
            raise self._folder_fault(fault)
        try:
            return self.location.client(settings)
        except Exception as error:  # the drivers raise several unrelated types here
            hint = ""
            if self.location.engine == "chdb" and self._held_by_another_process():
                hint = " (another process holds it: is another tracehouse serve on it?)"
            raise StoreUnavailable(
                f"cannot reach the store {self.location.display}: {clean_error(error)}{hint}"
            ) from error

    @contextlib.contextmanager
    def _client(self, failure: type[StoreError] = StoreUnavailable) -> Iterator[Client]:
        """A pooled client; a connection failure is StoreUnavailable, an engine error `failure`."""
        try:
            with self._pool.client() as client:
                yield client
        except OperationalError as error:
            raise StoreUnavailable(f"store {self.location.display}: {clean_error(error)}") from error
        except ClickHouseError as error:
            if error_code(error) in _NOT_WRITABLE_CODES or _NOT_WRITABLE_TEXT.search(str(error)):
                fault = self._not_writable()
                if fault is not None:
                    raise self._folder_fault(fault) from error
                failure = StoreUnavailable
            raise failure(f"store {self.location.display}: {clean_error(error)}") from error

    # -- schema -------------------------------------------------------------------------

    def migrate(self) -> int:
        """Apply every migration newer than the store's version; return the version."""
        layout = self.layout
        with self._client() as client:
            # a store made by `tracehouse schema` needs no DDL here, nor the grants for it
            found = client.query(
                "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'schema_migrations'",
                parameters={"db": self.location.database},
            ).result_rows
            if not found[0][0]:
                client.command(f"CREATE DATABASE IF NOT EXISTS {self.db}{layout.on_cluster()}")
                for statement in render(LEDGER, layout):
                    client.command(statement)
            current = self._schema_version(client)
            if current > LATEST_VERSION:
                raise StoreUnavailable(
                    f"store {self.location.display} has schema v{current}, newer than this tracehouse "
                    f"(v{LATEST_VERSION}): upgrade tracehouse"
                )
            for migration in MIGRATIONS:
                if migration.version <= current:
                    continue
                log.info("applying migration %d: %s", migration.version, migration.name)
                for step in migration.steps:
                    for statement in render(step, layout):
                        client.command(statement)
                client.command(
                    f"INSERT INTO {self.db}.schema_migrations (version, name) VALUES "
                    "({version:UInt32}, {name:String})",
                    parameters={"version": migration.version, "name": migration.name},
                )
            self._apply_retention(client)
            return self._schema_version(client)

    def _apply_retention(self, client: Client) -> None:
        """Make each table's TTL what --retention says; tables it does not name keep theirs."""
        for name, seconds in sorted(self.layout.retention.items()):
            table = TABLES_BY_NAME[name]
            found = client.query(
                "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {name:String}",
                parameters={"db": self.location.database, "name": self.layout.local_name(name)},
            ).result_rows
            engine = str(found[0][0]) if found else ""
            wanted = ttl_expression(table, seconds) if seconds else ""
            current = engine.partition(" TTL ")[2].partition(" SETTINGS ")[0]
            if current == wanted:
                continue
            log.info("retention of %s: %s", name, f"{seconds} s" if seconds else "for good")
            client.command(retention_ddl(table, self.layout, seconds))

    def schema_version(self) -> int:
        with self._client() as client:
            return self._schema_version(client)

    def _schema_version(self, client: Client) -> int:
        rows = client.query(f"SELECT max(version) FROM {self.db}.schema_migrations").result_rows
        return int(rows[0][0] or 0)

    # -- writes -------------------------------------------------------------------------

    def write(self, batch: ValidatedBatch, received_ns: int) -> WriteResult:
        """Store the batch once. Safe to call again with the same batch after any failure."""
        self.ensure_ready()
        rows = batch.rows()
        with self._exclusive(batch.batch_id), self._client() as client:
            stored = self._ledger(client, batch.batch_id)
            if stored is not None:
                digest, counts = stored
                if digest != batch.digest:
                    raise BatchConflict(
                        f"batch_id {batch.batch_id!r} was stored before with other content "
                        f"({_describe(counts)}; this one has {_describe(rows)}): use a new batch_id"
                    )
                return WriteResult(duplicate=True, rows=rows)
            for table in TABLES:
                data = getattr(batch, table)
                if data is not None:
                    try:
                        client.insert_arrow(
                            f"{self.db}.{table}",
                            data,
                            settings={
                                "insert_deduplication_token": f"{batch.batch_id}/{table}",
                                # the rollups of a retried insert are deduplicated with it
                                "deduplicate_blocks_in_dependent_materialized_views": 1,
                            },
                        )
                    except DatabaseError as error:
                        if error_code(error) not in _BAD_DATA:
                            raise
                        # validation lets through nothing the engine refuses: a gap there, logged
                        log.error("the store refused %s of batch %s: %s", table, batch.batch_id, clean_error(error))
                        raise BatchRefused(f"{table}: the store refused these rows: {clean_error(error)}") from error
            client.insert_arrow(
                f"{self.db}.ingest_batches",
                pa.table(
                    {
                        "batch_id": [batch.batch_id],
                        "digest": [batch.digest],
                        "received": pa.array([received_ns], pa.timestamp("ns", tz="UTC")),
                        **{table: pa.array([rows[table]], pa.uint32()) for table in TABLES},
                    }
                ),
            )
        return WriteResult(duplicate=False, rows=rows)

    def _ledger(self, client: Client, batch_id: str) -> tuple[str, dict[str, int]] | None:
        found = client.query(
            f"SELECT digest, {', '.join(TABLES)} FROM {self.db}.ingest_batches WHERE batch_id = {{id:String}} LIMIT 1",
            parameters={"id": batch_id},
        ).result_rows
        if not found:
            return None
        digest, *counts = found[0]
        return str(digest), dict(zip(TABLES, (int(v) for v in counts), strict=True))

    @contextlib.contextmanager
    def _exclusive(self, batch_id: str) -> Iterator[None]:
        """Writes of one batch_id in this process happen one after another."""
        with self._in_flight_changed:
            while batch_id in self._in_flight:
                self._in_flight_changed.wait()
            self._in_flight.add(batch_id)
        try:
            yield
        finally:
            with self._in_flight_changed:
                self._in_flight.discard(batch_id)
                self._in_flight_changed.notify_all()

    # -- reads --------------------------------------------------------------------------

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        """Run one of tracehouse's own queries; `{db}` in the text names the database."""
        self.ensure_ready()
        if not self.materialized_cte:
            sql = without_materialized_cte(sql)
        with self._client(failure=StoreError) as client:
            return client.query_arrow(sql.replace("{db}", self.db), parameters=dict(parameters or {}))

    def execute(self, sql: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Run one of tracehouse's own statements that answers nothing (benchmarks fill the store so)."""
        self.ensure_ready()
        with self._client(failure=StoreError) as client:
            client.command(sql.replace("{db}", self.db), parameters=dict(parameters or {}))

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

    def ping(self) -> bool:
        try:
            with self._client() as client:
                return bool(client.ping())
        except StoreError:
            return False

    def close(self) -> None:
        self._closed = True
        self._pool.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- run descriptions, for the checks in ingest/grants.py ------------------------------

    def run_states(self, batch: ValidatedBatch) -> dict[str, tuple[str, bool]] | None:
        """The latest stored (host, importing) of each run `batch` describes that has one; None
        when this very batch (same id, same content) is stored already: it will store nothing."""
        self.ensure_ready()
        run_ids = [] if batch.runs is None else sorted(set(batch.runs.column("run_id").to_pylist()))
        with self._client() as client:
            stored = self._ledger(client, batch.batch_id)
            if stored is not None and stored[0] == batch.digest:
                return None
            found = self._run_rows(client, run_ids)
        return {str(run_id): (str(host), bool(importing)) for run_id, host, importing in found}

    def run_hosts(self, run_ids: list[str]) -> dict[str, str]:
        """The host each of `run_ids` is stored under, for those that are stored."""
        self.ensure_ready()
        with self._client() as client:
            return {str(run_id): str(host) for run_id, host, _ in self._run_rows(client, run_ids)}

    def _run_rows(self, client: Client, run_ids: list[str]) -> list[Any]:
        return list(
            client.query(
                f"SELECT run_id, host, importing FROM {self.db}.runs FINAL WHERE run_id IN {{ids:Array(String)}}",
                parameters={"ids": run_ids},
            ).result_rows
        )


def without_materialized_cte(sql: str) -> str:
    """The query with its CTEs computed where referenced: same answer, maybe more work."""
    return _MATERIALIZED_CTE.sub("AS (", sql).replace("\nSETTINGS enable_materialized_cte = 1", "")


def _describe(rows: Mapping[str, int]) -> str:
    return ", ".join(f"{count} {table}" for table, count in rows.items() if count) or "no rows"
