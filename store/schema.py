"""The schema as data, and its DDL for one server or for a cluster.

One server: each table is a MergeTree of its name. A cluster: each table is a
Replicated*MergeTree named `<table>_local` on every node (paths and replicas from the
`{shard}`/`{replica}` macros) and a Distributed table of the plain name over them, so every
query and insert names the same tables either way. Materialized views live next to the local
tables, since each node rolls up what it stores.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# Window of recent inserts whose insert_deduplication_token ClickHouse remembers per table:
# a retried insert of the same batch after a partial failure is stored once.
DEDUP_WINDOW = 100_000
# Replicated tables keep each token in Keeper: fewer of them, for a week (a long spool replay);
# newer servers forget tokens after an hour unless told otherwise.
REPLICATED_DEDUP_WINDOW = 10_000
REPLICATED_DEDUP_SECONDS = 7 * 86400

SHARD_KEYS = {"host": "cityHash64(host)", "run_id": "cityHash64(run_id)"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_RETENTION = re.compile(r"(\d{1,6})([hdwy])")
_RETENTION_UNITS = {"h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


@dataclass(frozen=True)
class Table:
    name: str
    columns: str  # the column list as DDL
    engine: str  # MergeTree, ReplacingMergeTree or AggregatingMergeTree
    order_by: str
    comment: str
    version: str = ""  # ReplacingMergeTree's version column
    partition_by: str = ""
    ttl: str = ""  # a TTL that is part of the schema, not of --retention
    time_column: str = ""  # what --retention counts from; "" for tables kept for good
    shard_key: str = ""  # fixed sharding expression; "" follows --shards-by
    dedup: bool = True  # remember recent insert tokens, so a retried insert is stored once
    settings: str = ""  # more table settings, `name = value, ...`


@dataclass(frozen=True)
class View:
    """A materialized view: `select` reads `source` and its rows go to `target`."""

    name: str
    source: str
    target: str
    select: str  # the query, with `{source}` where the source table goes


@dataclass(frozen=True)
class Alter:
    """An ALTER of the table that stores the rows (on a cluster: each node's local table)."""

    table: str
    clause: str


@dataclass(frozen=True)
class Statement:
    """Plain SQL with `{db}` for the database, `{database}` for its bare name and `{on_cluster}` where
    the statement runs on every node; `local_only` statements are skipped on a cluster (an
    INSERT ... SELECT cannot run ON CLUSTER)."""

    sql: str
    local_only: bool = False


@dataclass(frozen=True)
class Drop:
    """Drops a materialized view, or a table (on a cluster: its Distributed table and each node's local one)."""

    name: str
    view: bool = False


Step = Table | View | Alter | Statement | Drop


@dataclass(frozen=True)
class Layout:
    """Where and how the schema is laid out: which database, on one server or a cluster."""

    database: str = "tracehouse"
    cluster: str = ""
    shards_by: str = "host"
    retention: Mapping[str, int] = field(default_factory=dict)  # table -> seconds; 0 keeps for good

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.database):
            raise ValueError(f"database: {self.database!r} is not a name (letters, digits, _)")
        if self.cluster and not _NAME.fullmatch(self.cluster):
            raise ValueError(f"cluster: {self.cluster!r} is not a name (letters, digits, _)")
        if self.shards_by not in SHARD_KEYS:
            raise ValueError(f"shards-by: {self.shards_by!r} is not one of {', '.join(SHARD_KEYS)}")

    @property
    def db(self) -> str:
        return f"`{self.database}`"

    def on_cluster(self) -> str:
        return f" ON CLUSTER '{self.cluster}'" if self.cluster else ""

    def local_name(self, table: str) -> str:
        """The name of the table that stores the rows: `<table>_local` on a cluster."""
        return f"{table}_local" if self.cluster else table

    def local(self, table: str) -> str:
        return f"{self.db}.{self.local_name(table)}"


def parse_retention(entries: list[str], tables: Mapping[str, tuple[str, ...]]) -> dict[str, int]:
    """`TABLE=DURATION` entries (e.g. samples=30d, rollups=1y, events=forever) to seconds per
    table; `tables` maps each name a user may give to the tables it stands for."""
    retention: dict[str, int] = {}
    for entry in entries:
        name, equals, text = entry.partition("=")
        name = name.strip()
        if not equals or name not in tables:
            raise ValueError(f"retention: {entry!r} is not TABLE=DURATION with TABLE one of {', '.join(tables)}")
        match = _RETENTION.fullmatch(text.strip())
        if text.strip() == "forever":
            seconds = 0
        elif match and int(match.group(1)) > 0:
            seconds = int(match.group(1)) * _RETENTION_UNITS[match.group(2)]
        else:
            raise ValueError(
                f"retention: {entry!r}: give a number of hours, days, weeks or years (12h, 30d, 8w, 1y) or 'forever'"
            )
        for table in tables[name]:
            retention[table] = seconds
    return retention


def describe_retention(seconds: int) -> str:
    if not seconds:
        return "forever"
    unit = next(unit for unit, size in sorted(_RETENTION_UNITS.items(), key=lambda u: -u[1]) if seconds % size == 0)
    return f"{seconds // _RETENTION_UNITS[unit]}{unit}"


def check_coarser_kept_longer(retention: Mapping[str, int], finest_first: tuple[str, ...]) -> None:
    """Each table in `finest_first` kept at least as long as the one before it: a rollup that
    expires before the data it sums up would leave coarse answers empty while the data is there."""
    for finer, coarser in itertools.pairwise(finest_first):
        kept = retention.get(coarser)
        if not kept:
            continue  # not changed here, or kept for good
        if not retention.get(finer) or retention[finer] > kept:
            raise ValueError(
                f"retention: {coarser}={describe_retention(kept)} would expire before {finer} "
                f"({describe_retention(retention[finer]) if finer in retention else 'not given'}): keep {coarser} "
                f"at least as long as {finer}, e.g. --retention {finer}={describe_retention(kept)}"
            )


def ttl_expression(table: Table, seconds: int) -> str:
    return f"toDateTime({table.time_column}) + toIntervalSecond({seconds})"


def _engine(table: Table, layout: Layout) -> str:
    args = [table.version] if table.version else []
    if layout.cluster:
        path = f"'/clickhouse/tables/{{shard}}/{layout.database}/{table.name}'"
        replica = "'{replica}'"
        return f"Replicated{table.engine}({', '.join([path, replica, *args])})"
    return f"{table.engine}({', '.join(args)})" if args else table.engine


def _ttls(table: Table, seconds: int) -> list[str]:
    """The table's TTLs: its own, and a retention of `seconds` (0: none)."""
    ttls = [table.ttl] if table.ttl else []
    if table.time_column and seconds:
        ttls.append(ttl_expression(table, seconds))
    return ttls


def table_ddl(table: Table, layout: Layout) -> list[str]:
    dedup = (
        f"replicated_deduplication_window = {REPLICATED_DEDUP_WINDOW}, "
        f"replicated_deduplication_window_seconds = {REPLICATED_DEDUP_SECONDS}"
        if layout.cluster
        else f"non_replicated_deduplication_window = {DEDUP_WINDOW}"
    )
    clauses = [f"ENGINE = {_engine(table, layout)}"]
    if table.partition_by:
        clauses.append(f"PARTITION BY {table.partition_by}")
    clauses.append(f"ORDER BY {table.order_by}")
    ttls = _ttls(table, layout.retention.get(table.name, 0))
    if ttls:
        clauses.append(f"TTL {', '.join(ttls)}")
    settings = [setting for setting in (dedup if table.dedup else "", table.settings) if setting]
    if settings:
        clauses.append(f"SETTINGS {', '.join(settings)}")
    clauses.append(f"COMMENT {quote(table.comment)}")
    create = (
        f"CREATE TABLE IF NOT EXISTS {layout.local(table.name)}{layout.on_cluster()} (\n"
        f"{table.columns.strip(chr(10))}\n) " + "\n".join(clauses)
    )
    if not layout.cluster:
        return [create]
    shard_key = table.shard_key or SHARD_KEYS[layout.shards_by]
    distributed = (
        f"CREATE TABLE IF NOT EXISTS {layout.db}.{table.name}{layout.on_cluster()} AS {layout.local(table.name)}\n"
        f"ENGINE = Distributed('{layout.cluster}', '{layout.database}', '{table.name}_local', {shard_key})"
    )
    return [create, distributed]


def view_ddl(view: View, layout: Layout) -> list[str]:
    select = view.select.format(source=layout.local(view.source)).strip()
    return [
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {layout.db}.{view.name}{layout.on_cluster()}\n"
        f"TO {layout.local(view.target)} AS\n{select}"
    ]


def render(step: Step, layout: Layout) -> list[str]:
    """The statements that carry out one step on this layout."""
    if isinstance(step, Table):
        return table_ddl(step, layout)
    if isinstance(step, View):
        return view_ddl(step, layout)
    if isinstance(step, Alter):
        return [f"ALTER TABLE {layout.local(step.table)}{layout.on_cluster()} {step.clause}"]
    if isinstance(step, Drop):
        kind = "VIEW" if step.view else "TABLE"
        names = [step.name] if step.view or not layout.cluster else [step.name, layout.local_name(step.name)]
        return [f"DROP {kind} IF EXISTS {layout.db}.{name}{layout.on_cluster()} SYNC" for name in names]
    if step.local_only and layout.cluster:
        return []
    return [
        step.sql.replace("{db}", layout.db)
        .replace("{database}", layout.database)
        .replace("{on_cluster}", layout.on_cluster())
    ]


def retention_ddl(table: Table, layout: Layout, seconds: int) -> str:
    """ALTER the table's retention: a TTL, or none when `seconds` is 0."""
    alter = f"ALTER TABLE {layout.local(table.name)}{layout.on_cluster()}"
    if not seconds:
        return f"{alter} REMOVE TTL"
    return f"{alter} MODIFY TTL {', '.join(_ttls(table, seconds))}"


def quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
