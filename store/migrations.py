"""Versioned schema migrations. Every statement is idempotent, so applying a migration
twice (a crash between DDL and bookkeeping, two servers starting together) is harmless.
Append new migrations; never edit one that has shipped."""

from __future__ import annotations

from dataclasses import dataclass

from store.jobtables import JOB_TABLES
from store.schema import (
    Alter,
    Drop,
    Layout,
    Statement,
    Step,
    View,
    check_coarser_kept_longer,
    parse_retention,
    quote,
    render,
)
from store.tables import (
    CAPTURES,
    DEVICES,
    EVENTS,
    INGEST_BATCHES,
    INGEST_PENDING,
    KEPT,
    KEPT_ANSWERS,
    KEPT_GAPS,
    KEPT_GPUS,
    KEPT_ISLANDS,
    KEPT_RANGES,
    KEPT_ROWS,
    KEPT_RUNS,
    LEDGER,
    ROLLUPS,
    RUNS,
    SAMPLES,
    SHIPPED_ROLLUP_SECONDS,
    rollup_of_rollup_select,
    rollup_select,
    rollup_tables,
)
from tracehouse.model import ROLLUP_SECONDS


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    steps: tuple[Step, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "runs, devices, samples, events and the batch ledger",
        (RUNS, DEVICES, SAMPLES, EVENTS, INGEST_BATCHES),
    ),
    Migration(
        2,
        "samples rolled up per second and per minute; values compressed harder",
        (
            # telemetry values repeat in byte patterns that Gorilla's XOR hides from ZSTD:
            # 1.14 bytes a value instead of 1.66 (tracehouse bench storage)
            Alter("samples", "MODIFY COLUMN value CODEC(ZSTD(3))"),
            # ids and times that climb row by row cost a byte or less as deltas: 16.9x
            # compression of events instead of 7.9x
            *(
                Alter("events", f"MODIFY COLUMN {column} CODEC(Delta, ZSTD(1))")
                for column in ("end", "launch_start", "correlation_id", "id")
            ),
            *(step for name, seconds in SHIPPED_ROLLUP_SECONDS.items() for step in rollup_tables(name, seconds)),
            # samples stored before the views existed; emptied first, so a rerun adds nothing twice.
            # Nothing else may write meanwhile: `serve` migrates before it serves, and a server
            # store shared by several `serve`s is upgraded with the others stopped.
            *(
                step
                for name, seconds in SHIPPED_ROLLUP_SECONDS.items()
                for step in (
                    Statement(f"TRUNCATE TABLE {{db}}.{name}", local_only=True),
                    Statement(f"INSERT INTO {{db}}.{name} {rollup_select('{db}.samples', seconds)}", local_only=True),
                )
            ),
        ),
    ),
    Migration(
        3,
        "the tables' columns as a view of this database, for user SQL (which reaches no system table)",
        (
            Statement(
                "CREATE VIEW IF NOT EXISTS {db}.columns{on_cluster} AS "
                "SELECT table, name, type, comment, position FROM system.columns "
                "WHERE database = '{database}' AND table IN ('runs', 'devices', 'samples', 'events')"
            ),
        ),
    ),
    Migration(4, "group commits under way, so that a crash mid-commit stores nothing twice", (INGEST_PENDING,)),
    Migration(
        5,
        "values stored as deltas; a rollup per 10 s instead of per second",
        (
            # a series' values as deltas of their bits, then ZSTD(9): 0.77 bytes a value instead of 1.04
            # (tracehouse bench storage), for 0.1 µs more CPU a value each time a part is written
            Alter("samples", "MODIFY COLUMN value CODEC(Delta, ZSTD(9))"),
            # at 10 Hz a rollup per second kept 3 floats for every 10 values, and 3 for every value of a
            # series read once a second: 0.89 bytes a value, against 0.10 per 10 s
            *rollup_tables("samples_10s", 10),
            # filled from the rollup per second, which still holds what --retention has taken from samples;
            # emptied first, so that a rerun adds nothing twice (nothing else writes during a migration)
            Statement("TRUNCATE TABLE {db}.samples_10s", local_only=True),
            Statement(
                f"INSERT INTO {{db}}.samples_10s {rollup_of_rollup_select('{db}.samples_1s', 10)}", local_only=True
            ),
            Drop("samples_1s_mv", view=True),
        ),
    ),
    # apart from migration 5, so that a rerun of 5 still finds the table it fills from
    Migration(6, "the rollup per second dropped", (Drop("samples_1s"),)),
    Migration(
        7,
        "the minute rollup summed up from the 10 s one",
        (
            # its view reads the 10 s rollup's rows, a hundredth of the samples at 10 Hz: half the CPU the
            # views took per stored value; the rows it makes are the same (min of mins, sums of sums)
            Drop("samples_1m_mv", view=True),
            View("samples_1m_mv", "samples_10s", "samples_1m", rollup_of_rollup_select("{source}", 60)),
        ),
    ),
    Migration(
        8,
        "samples merged in wider, fewer merges",
        (
            # a fleet inserts a part a second or more: merged 5 at a time (the default), a value was
            # rewritten 3 times in its first 30 s, for 2.0 µs of CPU per value stored and merged; 20 at a
            # time, once, for 1.4 µs (tracehouse bench load --writers; the setting is in ClickHouse 25.8)
            Alter("samples", "MODIFY SETTING merge_selector_base = 20"),
        ),
    ),
    Migration(
        9,
        "rollups made where each group commit is stored, not by materialized views",
        (
            # a view runs a pipeline of its own on every insert: 0.4 to 0.6 µs a value, against 0.1 to 0.2 for the
            # same rows made from the group's samples and inserted with its tokens (store/rollup.py)
            *(Drop(f"{name}_mv", view=True) for name in ROLLUP_SECONDS),
            *(
                Alter(name, f"MODIFY COMMENT 'samples rolled up per {seconds} s (by ingest, with each group commit)'")
                for name, seconds in ROLLUP_SECONDS.items()
            ),
        ),
    ),
    Migration(10, "captures on demand: requests and their outcomes", (CAPTURES,)),
    Migration(
        11, "traced runs' NVTX projections and busy islands kept once imported", (KEPT_RANGES, KEPT_ISLANDS, KEPT_RUNS)
    ),
    # runs kept before are kept again, these with the rest: what is kept is part of their fingerprint (query/kept.py)
    Migration(
        12,
        "traced runs' busy islands per GPU, their gaps longest first and their phases kept",
        (KEPT_GPUS, KEPT_GAPS, KEPT_ANSWERS),
    ),
    Migration(
        13,
        "rollups merged in wider, fewer merges",
        (
            # each group commit inserts a part into each rollup: merged 5 at a time, their merges took as
            # much CPU as the samples' did, for a tenth of the rows (tracehouse bench load --writers)
            *(Alter(name, "MODIFY SETTING merge_selector_base = 20") for name in ROLLUP_SECONDS),
        ),
    ),
    Migration(14, "distributed jobs: each rank with its clock alignment, and its steps in parts", JOB_TABLES),
)

LATEST_VERSION = MIGRATIONS[-1].version

TABLES_BY_NAME = {
    table.name: table
    for table in (RUNS, DEVICES, SAMPLES, EVENTS, INGEST_BATCHES, INGEST_PENDING, CAPTURES, *KEPT, *JOB_TABLES)
} | {name: table for name, (table, _) in ROLLUPS.items()}
# what `--retention NAME=DURATION` may name, and the tables each name stands for
RETENTION_NAMES = {
    "samples": ("samples",),
    "events": ("events", *(table.name for table in KEPT_ROWS)),  # what is kept of a run goes with its events
    "rollups": tuple(ROLLUP_SECONDS),
} | {name: (name,) for name in ROLLUP_SECONDS}


def retention(entries: list[str]) -> dict[str, int]:
    """`--retention` entries to seconds per table, a rollup never kept shorter than what it sums up."""
    chosen = parse_retention(entries, RETENTION_NAMES)
    check_coarser_kept_longer(chosen, ("samples", *sorted(ROLLUP_SECONDS, key=ROLLUP_SECONDS.__getitem__)))
    return chosen


def script(layout: Layout) -> list[str]:
    """Every statement that builds the latest schema on `layout`, and records it as applied:
    what `tracehouse schema` prints for clickhouse-client --multiquery."""
    statements = [f"CREATE DATABASE IF NOT EXISTS {layout.db}{layout.on_cluster()}", *render(LEDGER, layout)]
    for migration in MIGRATIONS:
        # a new schema has nothing to fill in: run on a store in use, a backfill would start over
        steps = [step for step in migration.steps if not (isinstance(step, Statement) and step.local_only)]
        statements += [statement for step in steps for statement in render(step, layout)]
    versions = ", ".join(f"({m.version}, {quote(m.name)})" for m in MIGRATIONS)
    statements.append(f"INSERT INTO {layout.db}.schema_migrations (version, name) VALUES {versions}")
    return statements
