"""Versioned schema migrations. Every statement is idempotent, so applying a migration
twice (a crash between DDL and bookkeeping, two servers starting together) is harmless.
Append new migrations; never edit one that has shipped."""

from __future__ import annotations

from dataclasses import dataclass

# Window of recent inserts whose insert_deduplication_token ClickHouse remembers per table:
# a retried insert of the same batch after a partial failure is stored once.
DEDUP_WINDOW = 100_000


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


LEDGER_TABLE = """
CREATE TABLE IF NOT EXISTS {db}.schema_migrations (
    version UInt32,
    name String,
    applied DateTime64(9, 'UTC') DEFAULT now64(9)
) ENGINE = MergeTree ORDER BY version
COMMENT 'schema versions applied to this database'
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "runs, devices, samples, events and the batch ledger",
        (
            f"""
CREATE TABLE IF NOT EXISTS {{db}}.runs (
    run_id String COMMENT 'stable id: derived from file content for imports',
    name String,
    host LowCardinality(String),
    source LowCardinality(String) COMMENT 'agent | nsys | kineto | user',
    start DateTime64(9, 'UTC'),
    end Nullable(DateTime64(9, 'UTC')) COMMENT 'NULL while the run is open',
    relative_time Bool COMMENT 'times count from an unknown origin (nsys before 2021.3)',
    tags Map(String, String) COMMENT 'user labels',
    attrs Map(String, String) COMMENT 'facts from the source: nsys version, command line, GPUs',
    importing Bool COMMENT 'an import under way: the run and its rows are left out of answers',
    updated DateTime64(9, 'UTC') COMMENT 'when this description arrived; the latest wins'
) ENGINE = ReplacingMergeTree(updated) ORDER BY run_id
SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}
COMMENT 'one row per run: an nsys import, an agent session, or a run the user declared'
""",
            f"""
CREATE TABLE IF NOT EXISTS {{db}}.devices (
    host LowCardinality(String),
    gpu Int16 COMMENT 'index on the host',
    uuid String,
    name String,
    memory_total UInt64 COMMENT 'bytes',
    sm_count UInt32,
    driver String,
    pci_bus_id String,
    run_id String COMMENT 'the run that described the device, if any',
    attrs Map(String, String),
    updated DateTime64(9, 'UTC') COMMENT 'when this description arrived; the latest wins'
) ENGINE = ReplacingMergeTree(updated) ORDER BY (host, gpu, uuid)
SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}
COMMENT 'GPUs per host'
""",
            f"""
CREATE TABLE IF NOT EXISTS {{db}}.samples (
    run_id LowCardinality(String) COMMENT 'agent session or import the sample came with',
    host LowCardinality(String),
    gpu Int16 COMMENT 'GPU index on the host; -1 for series not tied to one GPU',
    pid UInt32 COMMENT 'process the value is about; 0 for none',
    metric LowCardinality(String) COMMENT 'metric name; its unit is part of the name',
    ts DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)) COMMENT 'instant of the sample',
    value Float64 CODEC(Gorilla, ZSTD(1))
) ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (host, gpu, metric, ts)
SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}
COMMENT 'counter series: NVML telemetry, nsys GPU metrics, training scalars'
""",
            f"""
CREATE TABLE IF NOT EXISTS {{db}}.events (
    run_id LowCardinality(String),
    host LowCardinality(String),
    kind LowCardinality(String) COMMENT 'kernel, memcpy, memset, cuda_api, sync, nvtx, osrt, ...',
    start DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    end DateTime64(9, 'UTC') CODEC(ZSTD(1)) COMMENT 'exclusive; equal to start for an instant',
    gpu Int16 COMMENT '-1 when not on a GPU',
    stream Int32 COMMENT 'CUDA stream; -1 for none',
    pid UInt32,
    tid UInt64,
    name LowCardinality(String),
    correlation_id UInt64 COMMENT 'links GPU work to the API call that launched it; 0 for none',
    bytes UInt64 COMMENT 'memory operations: bytes moved or set',
    depth UInt16 COMMENT 'nesting level of ranges and ops',
    extras Map(LowCardinality(String), String) COMMENT 'display-only details',
    id UInt64 COMMENT 'unique per row, stable across re-sends of its batch',
    launch_start Nullable(DateTime64(9, 'UTC')) COMMENT 'GPU work: start of the API call that launched it',
    INDEX end_minmax end TYPE minmax GRANULARITY 1
) ENGINE = MergeTree
PARTITION BY toYYYYMM(start)
ORDER BY (host, kind, start)
SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}
COMMENT 'intervals and instants from traces'
""",
            """
CREATE TABLE IF NOT EXISTS {db}.ingest_batches (
    batch_id String,
    digest String COMMENT 'hash of the batch content: a batch_id re-used for other content is refused',
    received DateTime64(9, 'UTC'),
    samples UInt32,
    events UInt32,
    runs UInt32,
    devices UInt32
) ENGINE = ReplacingMergeTree ORDER BY batch_id
TTL toDateTime(received) + INTERVAL 90 DAY
COMMENT 'every batch stored, so a batch written again is recognised (for 90 days)'
""",
        ),
    ),
)

LATEST_VERSION = MIGRATIONS[-1].version
