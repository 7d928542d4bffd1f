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
import functools
import logging
import os
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError, OperationalError

from ingest.group import TABLES, Group, decode_tables, encode_tables, lone_group, new_group, stands_alone
from ingest.location import StoreLocation, parse_store_url, with_password
from ingest.migrations import LATEST_VERSION, LEDGER, MIGRATIONS, TABLES_BY_NAME
from ingest.rollup import rollups
from ingest.schema import Layout, render, retention_ddl, ttl_expression
from ingest.storeerrors import (
    BatchConflict,
    BatchRefused,
    QueryTooLarge,
    SqlRejected,
    StoreBusy,
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
from tracehouse.units import size

__all__ = [
    "TABLES",
    "BatchConflict",
    "BatchRefused",
    "QueryTooLarge",
    "SqlRejected",
    "Store",
    "StoreBusy",
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

# Codes with which the engine refuses an insert for what its rows hold: the batch, not the store, is wrong.
_BAD_DATA = {
    6, 27, 38, 41, 53, 69, 70, 72,  # CANNOT_PARSE_*, TYPE_MISMATCH, ARGUMENT_OUT_OF_BOUND, CANNOT_CONVERT_TYPE
    117, 131, 190, 321, 349,  # INCORRECT_DATA, TOO_LARGE_STRING_SIZE, SIZES_OF_ARRAYS_DONT_MATCH, out of range, NULL
}  # fmt: skip
# How an engine says that its files refuse writes: READONLY disk or table, no space, or the OS's errno.
_NOT_WRITABLE_CODES = {242, 243}  # TABLE_IS_READ_ONLY, NOT_ENOUGH_SPACE
_NOT_WRITABLE_TEXT = re.compile(r"Read-only file system|Permission denied|Operation not permitted|No space left")
_MATERIALIZED_CTE = re.compile(r"\bAS MATERIALIZED \(")
_TIMEOUT = {159, 160}  # TIMEOUT_EXCEEDED, TOO_SLOW
_MEMORY = 241  # MEMORY_LIMIT_EXCEEDED
BUSY_RETRY_MS = 1000  # what a read refused for want of a place is told to wait
_READER_NICE = 19  # the nice value of the engine threads that run a read: the lowest priority


@dataclass(frozen=True)
class WriteResult:
    duplicate: bool
    rows: Mapping[str, int]


@dataclass(frozen=True)
class Claim:
    """Batches of a group commit, claimed (Store.claim_group): those stored before, and the first
    of each other batch id, by index, now in the claimed group."""

    batches: Sequence[ValidatedBatch]
    finished: set[str]  # batch ids whose unfinished group the claim finished
    stored: Mapping[str, tuple[str, dict[str, int]]]  # batch id -> digest and rows, stored before
    first: Mapping[str, int]  # batch id -> index of its first batch, for those claimed now
    claimed: tuple[Group, threading.Event] | None

    def settled(self, i: int) -> WriteResult | StoreError | None:
        """Batch i's outcome if the claim decides it: a batch stored before (or by the group the claim
        finished). None for the others, which only storing the claimed group decides."""
        batch = self.batches[i]
        if batch.batch_id not in self.stored:
            return None
        outcome = _as_stored(batch, *self.stored[batch.batch_id])
        if isinstance(outcome, WriteResult) and batch.batch_id in self.finished:
            outcome = WriteResult(duplicate=False, rows=outcome.rows)  # its group was finished just now
        return outcome


class _PoolFull(Exception):
    """Every client of a pool stayed taken for as long as the caller would wait."""


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
    def client(self, wait_s: float | None = None) -> Iterator[Client]:
        """A client once one is free, waited for `wait_s` at most (None: as long as it takes)."""
        if not self._slots.acquire(timeout=wait_s):
            raise _PoolFull
        try:
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
        finally:
            self._slots.release()

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
        # writes (and the reads they need) have clients that no reader can take; tracehouse's own reads
        # have at most query_max_concurrent others, each a session of its own that keeps its bounds
        self._writers = _ClientPool(self._connect, pool_size)
        # reads (users' SQL too) run at the lowest CPU priority: on a busy machine they take what writes leave;
        # only in this process (a ClickHouse server ranks its own threads), where it can be given back
        low = {"os_threads_nice_value_query": _READER_NICE} if location.engine == "chdb" and _can_renice() else {}
        self._readers = _ClientPool(
            lambda: self._connect(low | _reader_settings(limits)), max(1, limits.query_max_concurrent)
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
                if self.sole_writer:
                    self._left_unfinished = self._unfinished_groups()
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
        except _PoolFull:
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

    # -- writes -------------------------------------------------------------------------

    def write(self, batch: ValidatedBatch, received_ns: int) -> WriteResult:
        """Store the batch once. Safe to call again with the same batch after any failure."""
        outcome = self.write_group([batch], received_ns)[0]
        if isinstance(outcome, StoreError):
            raise outcome
        return outcome

    def write_group(self, batches: Sequence[ValidatedBatch], received_ns: int) -> list[WriteResult | StoreError]:
        """Store each batch once, those not stored before as one group: one insert per table
        (ingest/group.py). An outcome per batch: a BatchConflict or BatchRefused stands for that
        batch alone. A failure of the store raises; what landed of the group is finished when one
        of its batches is written again (here or by another server on the store), or by
        finish_unfinished."""
        return self.store_claimed(self.claim_group(batches, received_ns))

    def claim_group(self, batches: Sequence[ValidatedBatch], received_ns: int) -> Claim:
        """The first half of write_group: which batches are stored already, and the others claimed
        as one group, whole in ingest_pending, so that from now on they are stored once whatever
        fails (Claim.settled). Then store_claimed, always, even after the store failed here."""
        self.ensure_ready()
        ids = sorted({batch.batch_id for batch in batches})
        with self._client() as client:
            finished, stored, first = self._claim(client, batches, ids, received_ns)
        fresh = sorted(first.values())
        claimed = self._claimed[batches[fresh[0]].batch_id] if fresh else None
        return Claim(batches, finished, stored, first, claimed)

    def store_claimed(self, claim: Claim) -> list[WriteResult | StoreError]:
        """The second half of write_group: the claimed group stored; an outcome per batch."""
        batches = claim.batches
        refused: dict[int, StoreError] = {}
        fresh = sorted(claim.first.values())
        if claim.claimed is not None:
            group, storing = claim.claimed
            try:
                with self._client() as client:
                    refused_here, taken = self._store_group(client, group)
                    refused = {fresh[j]: error for j, error in refused_here.items()}
                    for winner in {commit for commit in taken.values() if commit is not None}:
                        self._finish(client, winner)  # its server may be gone: answer only once it is stored
                refused.update({fresh[j]: _ALREADY_CLAIMED for j in taken})
            except BaseException:
                if self.sole_writer and not group.alone:  # a retry, or the sweep, finishes it
                    self._left_unfinished[group.commit] = frozenset(group.batch_ids)
                raise
            finally:
                with self._write_lock:
                    for batch_id in group.batch_ids:
                        del self._claimed[batch_id]
                storing.set()
        outcomes: list[WriteResult | StoreError] = []
        for i, batch in enumerate(batches):
            if refused.get(i) is _ALREADY_CLAIMED:
                outcomes.append(WriteResult(duplicate=True, rows=batch.rows()))
            elif i in refused:
                outcomes.append(refused[i])
            elif batch.batch_id in claim.stored or claim.first[batch.batch_id] == i:
                outcomes.append(claim.settled(i) or WriteResult(duplicate=False, rows=batch.rows()))
            else:  # the same batch twice in one group
                earlier = batches[claim.first[batch.batch_id]]
                outcomes.append(
                    refused.get(claim.first[batch.batch_id]) or _as_stored(batch, earlier.digest, earlier.rows())
                )
        return outcomes

    def _claim(
        self, client: Client, batches: Sequence[ValidatedBatch], ids: list[str], received_ns: int
    ) -> tuple[set[str], dict[str, tuple[str, dict[str, int]]], dict[str, int]]:
        """Which of `batches` are stored already (finishing the unfinished groups that hold any),
        and the index of the first of each other batch id, which are claimed as one new group,
        written to ingest_pending (but for one batch that stands alone: ingest/group.py). One claim
        at a time in this process; the groups claimed are stored at the same time, and a batch
        claimed already is waited for."""
        while True:
            with self._write_lock:
                busy = {self._claimed[batch_id][1] for batch_id in ids if batch_id in self._claimed}
                if not busy:
                    finished = {
                        batch_id
                        for commit in self._unfinished(client, ids)
                        for batch_id in self._finish(client, commit)
                    }
                    stored = self._ledger(client, ids)
                    first: dict[str, int] = {}
                    for i, batch in enumerate(batches):
                        if batch.batch_id not in stored:
                            first.setdefault(batch.batch_id, i)
                    if first:
                        fresh = [batches[i] for i in sorted(first.values())]
                        if len(fresh) == 1 and stands_alone(fresh[0]):
                            group = lone_group(fresh[0], received_ns)
                        else:
                            group = new_group(fresh, received_ns)
                            self._insert_pending(client, group)
                        claim = (group, threading.Event())
                        self._claimed.update(dict.fromkeys(group.batch_ids, claim))
                    return finished, stored, first
            for storing in busy:
                storing.wait()

    def _insert_pending(self, client: Client, group: Group) -> None:
        """The group, whole, before any of it goes to the tables; with it, the done marks of the
        groups finished since the last one (one insert, so one part, per group)."""
        self._insert_with_done_marks(client, [_pending_row(group)])
        _crash_point("pending")

    def mark_done(self) -> None:
        """The done marks of the groups finished since the last claim, written now (at a clean stop):
        else the next server on the store takes them for groups a crash left unfinished, stores them
        again (nothing twice: the same tokens) and logs that a stopped server left them unfinished."""
        with self._done_lock:
            if not self._done:
                return
        with self._client() as client:
            self._insert_with_done_marks(client, [])

    def _insert_with_done_marks(self, client: Client, rows: list[dict[str, Any]]) -> None:
        with self._done_lock:
            done, self._done = self._done, []
        rows = [*rows, *(_done_row(commit) for commit in done)]
        try:
            client.insert_arrow(f"{self.db}.ingest_pending", pa.Table.from_pylist(rows, schema=_PENDING_SCHEMA))
        except BaseException:
            with self._done_lock:
                self._done.extend(done)
            raise

    def _store_group(self, client: Client, group: Group) -> tuple[dict[int, BatchRefused], dict[int, int | None]]:
        """Insert the group's rows per table, then its ledger rows. Returns the batches (by index)
        whose rows the store refused, and those another group claimed first (the commit of the
        one to finish, None when stored), which this group leaves out. The same group stored
        again stores nothing twice: the inserts carry its tokens, and what is left out is worked
        out again the same way."""
        taken = self._taken_elsewhere(client, group)
        refused: dict[int, BatchRefused] = {}
        for table in TABLES:
            if table not in group.tables:
                continue
            left_out = set(refused) | set(taken)
            data = group.without(left_out, table) if left_out else group.tables[table]
            try:
                if data.num_rows:
                    self._insert(client, table, data, group.token(table))
            except BatchRefused as error:
                if len(group.batch_ids) == 1:
                    log.error("batch %s is not stored: %s", group.batch_ids[0], error)
                    refused[0] = error
                    continue
                for i, part in enumerate(group.slices(table)):  # which batch: each on its own
                    if i not in refused and part.num_rows:
                        try:
                            self._insert(client, table, part, f"{group.token(table)}/{i}")
                        except BatchRefused as alone:
                            log.error("batch %s is not stored: %s", group.batch_ids[i], alone)
                            refused[i] = alone
            if table == "samples":
                kept = group.without(set(refused) | set(taken), table) if refused or taken else data
                for rollup, rows in rollups(kept).items() if kept.num_rows else ():
                    self._insert(client, rollup, rows, group.token(rollup))
            _crash_point(f"table:{table}")
        _crash_point("tables")
        kept = [i for i in range(len(group.batch_ids)) if i not in refused and i not in taken]
        if kept:
            client.insert_arrow(
                f"{self.db}.ingest_batches",
                pa.table(
                    {
                        "batch_id": [group.batch_ids[i] for i in kept],
                        "digest": [group.digests[i] for i in kept],
                        "received": pa.array([group.received_ns] * len(kept), pa.timestamp("ns", tz="UTC")),
                        **{
                            table: pa.array([group.rows[i].get(table, 0) for i in kept], pa.uint32())
                            for table in TABLES
                        },
                    }
                ),
            )
        _crash_point("ledger")
        if not group.alone:
            with self._done_lock:
                self._done.append(group.commit)
        return refused, taken

    def _taken_elsewhere(self, client: Client, group: Group) -> dict[int, int | None]:
        """The group's batches that another group claimed before it, as the engine numbered the
        claims' inserts (two servers that both found a batch unclaimed both claim it; the first
        claim stores it), with that group's commit; or that are stored by now (None). None of
        them when this is the store's only writer, whose claims are taken one at a time."""
        if self.sole_writer:
            return {}
        ids = list(group.batch_ids)
        first: dict[str, int] = {
            str(batch_id): int(commit)
            for batch_id, commit in client.query(
                f"SELECT batch_id, argMin(commit, _block_number) FROM {self.db}.ingest_pending "
                "ARRAY JOIN batch_ids AS batch_id WHERE hasAny(batch_ids, {ids:Array(String)}) "
                "AND batch_id IN {ids:Array(String)} GROUP BY batch_id",
                parameters={"ids": ids},
            ).result_rows
        }
        stored = self._ledger(client, ids)
        taken: dict[int, int | None] = {}
        for i, batch_id in enumerate(ids):
            if batch_id in stored:
                taken[i] = None
            elif first.get(batch_id, group.commit) != group.commit:
                taken[i] = first[batch_id]
        return taken

    def _insert(self, client: Client, table: str, data: pa.Table, token: str) -> None:
        try:
            client.insert_arrow(
                f"{self.db}.{table}",
                data.combine_chunks(),  # one block for the engine, not one per batch: half the CPU
                settings={"insert_deduplication_token": token},
            )
        except DatabaseError as error:
            if error_code(error) not in _BAD_DATA:
                raise
            # validation lets through nothing the engine refuses: a gap there, logged
            log.error("the store refused %s of insert %s: %s", table, token, clean_error(error))
            raise BatchRefused(f"{table}: the store refused these rows: {clean_error(error)}") from error

    def _unfinished(self, client: Client, batch_ids: list[str]) -> list[int]:
        """The unfinished groups that hold any of `batch_ids`."""
        if self.sole_writer:
            wanted = set(batch_ids)
            return [commit for commit, held in list(self._left_unfinished.items()) if held & wanted]
        found = client.query(
            f"SELECT commit FROM {self.db}.ingest_pending WHERE commit IN "
            f"(SELECT commit FROM {self.db}.ingest_pending WHERE hasAny(batch_ids, {{ids:Array(String)}})) "
            "GROUP BY commit HAVING max(done) = 0",
            parameters={"ids": batch_ids},
        ).result_rows
        with self._done_lock:
            done = set(self._done)  # finished here, not yet marked
        return [int(row[0]) for row in found if int(row[0]) not in done]

    def _unfinished_groups(self) -> dict[int, frozenset[str]]:
        """Every unfinished group, with its batch ids."""
        with self._client() as client:
            found = client.query(
                f"SELECT commit, anyIf(batch_ids, done = 0) FROM {self.db}.ingest_pending "
                "GROUP BY commit HAVING max(done) = 0"
            ).result_rows
        return {int(commit): frozenset(batch_ids) for commit, batch_ids in found}

    def _finish(self, client: Client, commit: int) -> tuple[str, ...]:
        """Store again what an unfinished group holds (what of it landed is not stored twice); its batch ids."""
        found = client.query(
            f"SELECT received, batch_ids, digests, rows, {', '.join(TABLES)} FROM {self.db}.ingest_pending "
            "WHERE commit = {commit:UInt64} AND done = 0 LIMIT 1",
            parameters={"commit": commit},
            column_formats=dict.fromkeys(TABLES, "bytes"),
        ).result_rows
        if not found:
            return ()
        received, batch_ids, digests, rows, *payloads = found[0]
        if len(self._ledger(client, list(batch_ids))) == len(batch_ids):  # the ledger comes last: all landed
            with self._done_lock:
                self._done.append(commit)
            self._left_unfinished.pop(commit, None)
            return ()
        tables = decode_tables({table: data for table, data in zip(TABLES, payloads, strict=True) if data})
        group = Group(commit, _ns(received), tuple(batch_ids), tuple(digests), tuple(rows), tables)
        log.warning("finishing group commit %d (%d batches), left unfinished by its server", commit, len(rows))
        self._store_group(client, group)
        self._left_unfinished.pop(commit, None)
        return group.batch_ids

    def finish_unfinished(self, older_than_s: float) -> int:
        """Finish the groups left unfinished for over `older_than_s` (their servers stopped, their
        writers gone), and mark the finished ones done; how many were finished."""
        self.ensure_ready()
        with self._client() as client:
            commits = [
                int(row[0])
                for row in client.query(
                    f"SELECT commit FROM {self.db}.ingest_pending GROUP BY commit "
                    "HAVING max(done) = 0 AND min(received) < now64(9) - toIntervalMillisecond({age:UInt64})",
                    parameters={"age": int(older_than_s * 1000)},
                ).result_rows
            ]
            for commit in commits:
                self._finish(client, commit)
            with self._done_lock:
                done, self._done = self._done, []
            if done:
                client.insert_arrow(
                    f"{self.db}.ingest_pending",
                    pa.Table.from_pylist([_done_row(commit) for commit in done], schema=_PENDING_SCHEMA),
                )
        return len(commits)

    def _ledger(self, client: Client, batch_ids: list[str]) -> dict[str, tuple[str, dict[str, int]]]:
        found = client.query(
            f"SELECT batch_id, any(digest), {', '.join(f'any({table})' for table in TABLES)} "
            f"FROM {self.db}.ingest_batches WHERE batch_id IN {{ids:Array(String)}} GROUP BY batch_id",
            parameters={"ids": batch_ids},
        ).result_rows
        return {
            str(batch_id): (str(digest), dict(zip(TABLES, (int(v) for v in counts), strict=True)))
            for batch_id, digest, *counts in found
        }

    # -- reads --------------------------------------------------------------------------

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
            client.insert_arrow(f"{self.db}.{table}", data)

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
        self._writers.close()
        self._readers.close()

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
            stored = self._ledger(client, [batch.batch_id]).get(batch.batch_id)
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


def _reader_settings(limits: Limits) -> dict[str, Any]:
    """What each reader's session keeps: its bounds (its clients run nothing else)."""
    return {
        "max_execution_time": limits.query_max_seconds,
        "max_memory_usage": limits.query_max_memory_bytes // max(1, limits.query_max_concurrent),
        "max_threads": limits.query_max_threads or max(1, len(os.sched_getaffinity(0)) // 2),
    }


@functools.cache
def _can_renice() -> bool:
    """Whether this process may give a thread back the priority it lowered (CAP_SYS_NICE, as root): the
    engine lowers the priority of the threads that run a read and gives it back after; without that,
    its shared threads would stay low, and a write's turn on one of them too."""
    able: list[bool] = []

    def probe() -> None:
        thread = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, thread)
        try:
            os.setpriority(os.PRIO_PROCESS, thread, now + 1)
            os.setpriority(os.PRIO_PROCESS, thread, now)
            able.append(True)
        except OSError:
            able.append(False)

    prober = threading.Thread(target=probe)  # a thread of its own: left lower, it ends
    prober.start()
    prober.join()
    return able[0]


def without_materialized_cte(sql: str) -> str:
    """The query with its CTEs computed where referenced: same answer, maybe more work."""
    return _MATERIALIZED_CTE.sub("AS (", sql).replace("\nSETTINGS enable_materialized_cte = 1", "")


_ALREADY_CLAIMED = StoreError("claimed first by another group")  # a marker, never raised
_PENDING_SCHEMA = pa.schema(
    [
        ("commit", pa.uint64()),
        ("done", pa.uint8()),
        ("received", pa.timestamp("ns", tz="UTC")),
        ("batch_ids", pa.list_(pa.string())),
        ("digests", pa.list_(pa.string())),
        ("rows", pa.list_(pa.map_(pa.string(), pa.uint32()))),
        *((table, pa.binary()) for table in TABLES),
    ]
)


def _pending_row(group: Group) -> dict[str, Any]:
    payload = encode_tables(group.tables)
    return {
        "commit": group.commit,
        "done": 0,
        "received": time.time_ns(),  # what the TTL counts from, whatever the writer's clock said
        "batch_ids": list(group.batch_ids),
        "digests": list(group.digests),
        "rows": [list(counts.items()) for counts in group.rows],
        **{table: payload.get(table, b"") for table in TABLES},
    }


def _done_row(commit: int) -> dict[str, Any]:
    """Replaces the group's row at the next merge, and with it the group's rows kept there."""
    return {"commit": commit, "done": 1, "received": time.time_ns(), "batch_ids": [], "digests": [], "rows": []} | {
        table: b"" for table in TABLES
    }


def _as_stored(batch: ValidatedBatch, digest: str, counts: Mapping[str, int]) -> WriteResult | StoreError:
    """The outcome for a batch whose id is stored already with `digest`."""
    if digest != batch.digest:
        return BatchConflict(
            f"batch_id {batch.batch_id!r} was stored before with other content "
            f"({_describe(counts)}; this one has {_describe(batch.rows())}): use a new batch_id"
        )
    return WriteResult(duplicate=True, rows=batch.rows())


def _ns(instant: Any) -> int:
    """A DateTime64(9) as the driver reads it (an aware datetime) to ns since the epoch."""
    return int(pa.scalar(instant, pa.timestamp("ns", tz="UTC")).value)


def _crash_point(name: str) -> None:
    """Tests of recovery stop a server at a named point of a group commit, as kill -9 would."""
    if os.environ.get("TRACEHOUSE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _describe(rows: Mapping[str, int]) -> str:
    return ", ".join(f"{count} {table}" for table, count in rows.items() if count) or "no rows"
