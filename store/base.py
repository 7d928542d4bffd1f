"""The store's connection, on which store/store.py's Store builds: the client pools (a write never
waits behind a reader) and the gate of tracehouse's own reads, the engine's errors as the store's
(store/storeerrors.py), the embedded store's folder and the store's health, and migrations."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import pyarrow as pa
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError, OperationalError

from store.arrowinsert import insert_arrow
from store.group import Group
from store.location import StoreLocation
from store.migrations import LATEST_VERSION, MIGRATIONS, TABLES_BY_NAME
from store.pools import READER_NICE, ClientPool, PoolFull, can_renice, reader_settings
from store.schema import Layout, render, retention_ddl, ttl_expression
from store.storeerrors import (
    QueryTooLarge,
    StoreBusy,
    StoreError,
    StoreNotWritable,
    StoreUnavailable,
    clean_error,
    error_code,
)
from store.storefolder import held_by_another_process, not_writable
from store.tables import LEDGER
from store.usersql import UserSql
from tracehouse.model import Limits
from tracehouse.units import size

log = logging.getLogger(__name__)

_NOT_WRITABLE_CODES = {242, 243}  # TABLE_IS_READ_ONLY, NOT_ENOUGH_SPACE
_NOT_WRITABLE_TEXT = re.compile(r"Read-only file system|Permission denied|Operation not permitted|No space left")
_TIMEOUT = {159, 160}  # TIMEOUT_EXCEEDED, TOO_SLOW
_MEMORY = 241  # MEMORY_LIMIT_EXCEEDED
BUSY_RETRY_MS = 1000  # what a read refused for want of a place is told to wait


class StoreBase:
    """Connects and migrates: the client pools (a write never waits behind a reader), the gate of
    tracehouse's own reads, the engine's errors as the store's, and the store's health."""

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
        # writes (and the reads they need) have clients that no reader can take; tracehouse's own reads
        # have at most query_max_concurrent others, each a session of its own that keeps its bounds
        self._writers = ClientPool(self._connect, pool_size)
        # reads (users' SQL too) run at the lowest CPU priority: on a busy machine they take what writes leave;
        # only in this process (a ClickHouse server ranks its own threads), where it can be given back
        low = {"os_threads_nice_value_query": READER_NICE} if location.engine == "chdb" and can_renice() else {}
        self._readers = ClientPool(
            lambda: self._connect(low | reader_settings(limits)), max(1, limits.query_max_concurrent)
        )
        self._write_lock = threading.Lock()  # a batch written twice at once is stored once
        self._claimed: dict[str, tuple[Group, threading.Event]] = {}  # batch id -> its group, being stored
        self._done: list[int] = []  # groups finished here and not yet marked done in ingest_pending
        self._done_lock = threading.Lock()
        # an embedded store has one writing process (the engine locks its folder): the groups a crash
        # left unfinished are found once, at start, and no other server claims a batch meanwhile
        self.sole_writer = location.engine == "chdb"
        self._left_unfinished: dict[int, frozenset[str]] = {}  # commit -> its batch ids (sole writer)
        self._ready = False
        self._ready_lock = threading.Lock()
        # WITH x AS MATERIALIZED: ClickHouse 26.1 and newer, and not yet reliable over Distributed
        self.materialized_cte = False
        self._closed = False
        self._user_sql = UserSql(
            location, limits, self.layout.cluster, lambda settings: self._connect(low | dict(settings))
        )
        self._fault: StoreNotWritable | None = None  # while the folder refuses writes
        self._listeners: list[Callable[[bool], None]] = []
        self._health_lock = threading.Lock()

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
                if self.sole_writer:
                    self._left_unfinished = self._unfinished_groups()
                self.materialized_cte = not self.layout.cluster and self._has_setting("enable_materialized_cte")
                self._ready = True
        self._health_changed()

    def _unfinished_groups(self) -> dict[int, frozenset[str]]:
        """Every unfinished group, with its batch ids."""
        with self._client() as client:
            found = client.query(
                f"SELECT commit, anyIf(batch_ids, done = 0) FROM {self.db}.ingest_pending "
                "GROUP BY commit HAVING max(done) = 0"
            ).result_rows
        return {int(commit): frozenset(batch_ids) for commit, batch_ids in found}

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

    def _insert_table(
        self, client: Client, table: str, data: pa.Table, settings: Mapping[str, Any] | None = None
    ) -> None:
        """`data` into one of the store's tables, as this store's engine takes it best (store/arrowinsert.py)."""
        insert_arrow(client, self.location.engine, f"{self.db}.{table}", data, settings)

    @contextlib.contextmanager
    def _client(self, failure: type[StoreError] = StoreUnavailable) -> Iterator[Client]:
        """A writer's client; a connection failure is StoreUnavailable, an engine error `failure`."""
        with self._engine_errors(failure), self._writers.client() as client:
            yield client

    @contextlib.contextmanager
    def _reader(self) -> Iterator[Client]:
        """A client for one of tracehouse's own reads: one of query_max_concurrent places, waited for
        query_queue_seconds at most, then StoreBusy; past its time or memory, QueryTooLarge."""
        limits = self.limits
        started = time.monotonic()
        try:
            with self._engine_errors(StoreError, started), self._readers.client(limits.query_queue_seconds) as client:
                yield client
        except PoolFull:
            raise StoreBusy(
                f"busy: as many reads are running as may at once ({limits.query_max_concurrent}): "
                f"try again in {BUSY_RETRY_MS / 1000:g} s",
                BUSY_RETRY_MS,
            ) from None

    @contextlib.contextmanager
    def _engine_errors(self, failure: type[StoreError], read_since: float | None = None) -> Iterator[None]:
        """The engine's errors as the store's: a connection failure is StoreUnavailable, an engine error
        `failure`, a read's (started at `read_since`) bound on time or memory QueryTooLarge."""
        try:
            yield
        except OperationalError as error:
            raise StoreUnavailable(f"store {self.location.display}: {clean_error(error)}") from error
        except ClickHouseError as error:
            code = error_code(error)
            if code in _NOT_WRITABLE_CODES or _NOT_WRITABLE_TEXT.search(str(error)):
                fault = self._not_writable()
                if fault is not None:
                    raise self._folder_fault(fault) from error
                failure = StoreUnavailable
            elif read_since is not None and (code in _TIMEOUT or code == _MEMORY):
                raise QueryTooLarge(self._too_large(code, time.monotonic() - read_since)) from error
            raise failure(f"store {self.location.display}: {clean_error(error)}") from error

    def _too_large(self, code: int | None, seconds: float) -> str:
        limits = self.limits
        if code == _MEMORY:
            share = size(limits.query_max_memory_bytes // max(1, limits.query_max_concurrent))
            what = f"needed more than its {share} of memory (reads at once share {size(limits.query_max_memory_bytes)})"
        else:
            what = f"ran past the {limits.query_max_seconds:g} s limit of one read ({seconds:.1f} s)"
        return f"the query {what}: ask about a shorter window, fewer runs or fewer points"

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

    def ping(self) -> bool:
        try:
            with self._client() as client:
                return bool(client.ping())
        except StoreError:
            return False

    def close(self) -> None:
        self._closed = True
        self._writers.close()
        self._readers.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
