"""The store's tables, as the latest migration leaves them (store/migrations.py makes them): each
column documented where it is declared; and the rollups of `samples`."""

from __future__ import annotations

from store.schema import Table, View
from tracehouse.model import ROLLUP_SECONDS

LEDGER = Table(
    "schema_migrations",
    """
    version UInt32,
    name String,
    applied DateTime64(9, 'UTC') DEFAULT now64(9)
""",
    "MergeTree",
    order_by="version",
    comment="schema versions applied to this database",
    shard_key="version",
    dedup=False,
)

RUNS = Table(
    "runs",
    """
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
""",
    "ReplacingMergeTree",
    version="updated",
    order_by="run_id",
    comment="one row per run: an nsys import, an agent session, or a run the user declared",
    shard_key="cityHash64(run_id)",  # every version of a run on one shard, for FINAL
)

DEVICES = Table(
    "devices",
    """
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
""",
    "ReplacingMergeTree",
    version="updated",
    order_by="(host, gpu, uuid)",
    comment="GPUs per host",
    shard_key="cityHash64(host)",
)

SAMPLES = Table(
    "samples",
    """
    run_id LowCardinality(String) COMMENT 'agent session or import the sample came with',
    host LowCardinality(String),
    gpu Int16 COMMENT 'GPU index on the host; -1 for series not tied to one GPU',
    pid UInt32 COMMENT 'process the value is about; 0 for none',
    metric LowCardinality(String) COMMENT 'metric name; its unit is part of the name',
    ts DateTime64(9, 'UTC') COMMENT 'instant of the sample' CODEC(DoubleDelta, ZSTD(1)),
    value Float64 CODEC(Gorilla, ZSTD(1))
""",
    "MergeTree",
    partition_by="toYYYYMM(ts)",
    order_by="(host, gpu, metric, ts)",
    comment="counter series: NVML telemetry, nsys GPU metrics, training scalars",
    time_column="ts",
)

EVENTS = Table(
    "events",
    """
    run_id LowCardinality(String),
    host LowCardinality(String),
    kind LowCardinality(String) COMMENT 'kernel, memcpy, memset, cuda_api, sync, nvtx, osrt, ...',
    start DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    end DateTime64(9, 'UTC') COMMENT 'exclusive; equal to start for an instant' CODEC(ZSTD(1)),
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
""",
    "MergeTree",
    partition_by="toYYYYMM(start)",
    order_by="(host, kind, start)",
    comment="intervals and instants from traces",
    time_column="start",
)

INGEST_BATCHES = Table(
    "ingest_batches",
    """
    batch_id String,
    digest String COMMENT 'hash of the batch content: a batch_id re-used for other content is refused',
    received DateTime64(9, 'UTC'),
    samples UInt32,
    events UInt32,
    runs UInt32,
    devices UInt32
""",
    "ReplacingMergeTree",
    order_by="batch_id",
    ttl="toDateTime(received) + INTERVAL 90 DAY",
    comment="every batch stored, so a batch written again is recognised (for 90 days)",
    shard_key="cityHash64(batch_id)",
    dedup=False,
)

# Each group commit (ingest/groupcommit.py) is written here first, whole, then to the tables and the ledger,
# then marked done: a group a crash left unfinished is finished from here, by whichever server meets one of
# its batches again or sweeps it up, with the same insert tokens, so what did land is not stored twice.
# A done row (version 1, empty) replaces the group's row at the next merge.
INGEST_PENDING = Table(
    "ingest_pending",
    """
    commit UInt64 COMMENT 'the group commit: its insert tokens are <commit>/<table>',
    done UInt8 COMMENT '1: stored whole; the row that replaces the group''s data',
    received DateTime64(9, 'UTC'),
    batch_ids Array(String),
    digests Array(String),
    rows Array(Map(LowCardinality(String), UInt32)) COMMENT 'each batch''s rows per table',
    samples String COMMENT 'the group''s rows of the table, as an LZ4 Arrow IPC stream; empty: none' CODEC(NONE),
    events String CODEC(NONE),
    runs String CODEC(NONE),
    devices String CODEC(NONE),
    INDEX batch_ids_bloom batch_ids TYPE bloom_filter GRANULARITY 1
""",
    "ReplacingMergeTree",
    version="done",
    order_by="commit",
    ttl="toDateTime(received) + INTERVAL 1 DAY",
    comment="group commits under way: what a crash left half-stored is finished from here",
    shard_key="commit",
    # which of two claims of one batch came first, as the engine recorded them (Store._claim)
    settings="enable_block_number_column = 1",
)

CAPTURES = Table(
    "captures",
    """
    request_id String,
    run_id String,
    record LowCardinality(String) COMMENT 'request: what was asked; report: what a process did; comparison',
    at DateTime64(9, 'UTC'),
    requested_by String COMMENT 'request: the caller (peer, and its token''s bounds)',
    reason String COMMENT 'request: why it was asked; report: why it failed',
    first_step Int64 COMMENT 'request: the step to start at (-1: the next); report: the first captured',
    last_step Int64 COMMENT 'report: the last step captured; -1: none',
    steps UInt32 COMMENT 'request: steps to capture; 0: those starting within seconds',
    seconds Float64,
    ranks Array(UInt32) COMMENT 'request: the ranks asked; empty: all',
    session String COMMENT 'report: the process (STARTHEX.PID)',
    rank Int32,
    host String,
    state LowCardinality(String) COMMENT 'report: taken, capturing, imported or failed',
    trace_bytes UInt64,
    events UInt64 COMMENT 'report: rows of the profile imported into the run',
    comparison String COMMENT 'comparison: the captured steps against the rule''s baseline run, as JSON'
""",
    "MergeTree",
    order_by="(run_id, request_id, at)",
    partition_by="toYYYYMM(at)",
    ttl="toDateTime(at) + INTERVAL 400 DAY",
    comment="captures on demand: each request and what the run's processes reported of it",
    shard_key="cityHash64(run_id)",
)

# What is kept of a traced run once its import is over (query/kept.py): rows made from its events as they
# were (of the fingerprint `generation`), read while its events are the same.
KEPT_RANGES = Table(
    "kept_ranges",
    """
    run_id LowCardinality(String),
    host LowCardinality(String),
    gpu Int16 COMMENT '-1: a range is on no GPU (named so that a window''s filters apply as to events)',
    start DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    end DateTime64(9, 'UTC') CODEC(ZSTD(1)),
    range_id UInt64 COMMENT 'the range''s id in events',
    kind LowCardinality(String),
    name LowCardinality(String),
    style LowCardinality(String),
    depth UInt16,
    pid UInt32,
    tid UInt64,
    ops UInt64 COMMENT 'GPU work launched inside the range, on its thread',
    kernel_ops UInt64,
    first_start Nullable(Int64) COMMENT 'ns: the first of that work to start; NULL: none',
    last_end Nullable(Int64) COMMENT 'ns: the last of that work to end; NULL: none',
    generation UInt64 COMMENT 'the fingerprint of the run''s ranges and work the row was made from'
""",
    "MergeTree",
    order_by="(run_id, range_id)",
    comment="each traced run's ranges with the GPU work launched inside them (nvtx-gpu), kept once imported",
    time_column="start",
    shard_key="cityHash64(run_id)",
)

KEPT_ISLANDS = Table(
    "kept_islands",
    """
    run_id LowCardinality(String),
    host LowCardinality(String),
    gpu Int16,
    start DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    length Int64 COMMENT 'ns' CODEC(T64, LZ4),
    gap Int64 COMMENT 'ns from the end of the island before it on its GPU; 0: none' CODEC(T64, LZ4),
    end DateTime64(9, 'UTC') ALIAS fromUnixTimestamp64Nano(toUnixTimestamp64Nano(start) + length, 'UTC'),
    generation UInt64 COMMENT 'the fingerprint of the run''s ranges and work the row was made from'
""",
    "MergeTree",
    order_by="(run_id, host, gpu, start)",
    comment="each traced run's GPU work merged into busy islands per GPU (gpu-time), kept once imported",
    time_column="start",
    shard_key="cityHash64(run_id)",
)

# the islands summed up per GPU, and the gaps between them longest first: what gpu-time reads of a GPU whose
# every island lies in the window, a row per GPU and the longest gaps asked for
KEPT_GPUS = Table(
    "kept_gpus",
    """
    run_id LowCardinality(String),
    host LowCardinality(String),
    gpu Int16,
    start DateTime64(9, 'UTC') COMMENT 'the first island''s start',
    end DateTime64(9, 'UTC') COMMENT 'the last island''s end',
    busy Int64 COMMENT 'ns: the islands'' lengths summed',
    islands UInt64,
    generation UInt64 COMMENT 'the fingerprint of the run''s ranges and work the row was made from'
""",
    "MergeTree",
    order_by="(run_id, host, gpu)",
    comment="each traced run's busy islands summed up per GPU (gpu-time), kept once imported",
    time_column="end",  # kept while any of its islands is: retention takes a run's oldest rows first
    shard_key="cityHash64(run_id)",
)

KEPT_GAPS = Table(
    "kept_gaps",
    """
    run_id LowCardinality(String),
    host LowCardinality(String),
    gpu Int16,
    rank UInt64 COMMENT '1: the GPU''s longest gap; of gaps as long, the earliest first',
    start DateTime64(9, 'UTC') COMMENT 'the end of the island before the gap' CODEC(ZSTD(1)),
    length Int64 COMMENT 'ns' CODEC(T64, LZ4),
    generation UInt64 COMMENT 'the fingerprint of the run''s ranges and work the row was made from',
    INDEX length_minmax length TYPE minmax GRANULARITY 1
""",
    "MergeTree",
    order_by="(run_id, host, gpu, rank)",
    comment="the gaps between each traced run's busy islands per GPU, longest first (gpu-time), kept once imported",
    time_column="start",
    shard_key="cityHash64(run_id)",
)

# whole answers of a kept run's questions that read more than its rows: phases reads its host's telemetry
KEPT_ANSWERS = Table(
    "kept_answers",
    """
    run_id String,
    question LowCardinality(String) COMMENT 'phases',
    generation UInt64 COMMENT 'the fingerprint of the run''s ranges and work the answer was made from',
    telemetry UInt64 COMMENT 'the fingerprint of the telemetry the answer read',
    answer String COMMENT 'the answer as an Arrow IPC stream' CODEC(ZSTD(3)),
    rows UInt64,
    made DateTime64(9, 'UTC')
""",
    "ReplacingMergeTree",
    version="made",
    order_by="(run_id, question)",
    comment="the latest whole answer to each question of each kept run over its span, with what it was made from",
    time_column="made",
    shard_key="cityHash64(run_id)",
)

KEPT_RUNS = Table(
    "kept_runs",
    """
    run_id String,
    generation UInt64 COMMENT 'the fingerprint of the run''s ranges and work when its kept rows were made',
    made DateTime64(9, 'UTC')
""",
    "ReplacingMergeTree",
    version="made",
    order_by="run_id",
    comment="runs whose kept rows (kept_ranges, kept_islands) are whole, and of which fingerprint",
    shard_key="cityHash64(run_id)",
)

KEPT_ROWS = (KEPT_RANGES, KEPT_ISLANDS, KEPT_GPUS, KEPT_GAPS, KEPT_ANSWERS)  # a traced run's, with its fingerprint
KEPT = (*KEPT_ROWS, KEPT_RUNS)

# Rollups of `samples` (tracehouse.model.ROLLUP_SECONDS). min/max/sum/count rather than avg, so
# that any coarser bucket made of them has an exact average.


def rollup_tables(name: str, seconds: int) -> tuple[Table, View]:
    table = Table(
        name,
        f"""
    run_id LowCardinality(String),
    host LowCardinality(String),
    gpu Int16,
    pid UInt32,
    metric LowCardinality(String),
    ts DateTime64(9, 'UTC') COMMENT 'start of the {seconds} s the row sums up' CODEC(DoubleDelta, ZSTD(1)),
    min SimpleAggregateFunction(min, Float64) CODEC(ZSTD(3)),
    max SimpleAggregateFunction(max, Float64) CODEC(ZSTD(3)),
    sum SimpleAggregateFunction(sum, Float64) CODEC(ZSTD(3)),
    count SimpleAggregateFunction(sum, UInt64) CODEC(ZSTD(3))
""",
        "AggregatingMergeTree",
        partition_by="toYYYYMM(ts)",
        order_by="(host, gpu, metric, pid, run_id, ts)",
        comment=f"samples rolled up per {seconds} s (filled by {name}_mv)",
        time_column="ts",
    )
    view = View(f"{name}_mv", "samples", name, rollup_select("{source}", seconds))
    return table, view


def rollup_select(source: str, seconds: int) -> str:
    ns = seconds * 1_000_000_000
    return f"""
SELECT run_id, host, gpu, pid, metric,
       fromUnixTimestamp64Nano(intDiv(toUnixTimestamp64Nano(ts), {ns}) * {ns}, 'UTC') AS ts,
       min(value) AS min, max(value) AS max, sum(value) AS sum, count() AS count
FROM {source}
GROUP BY run_id, host, gpu, pid, metric, ts
"""


def rollup_of_rollup_select(source: str, seconds: int) -> str:
    """A finer rollup's rows summed up per `seconds`: the same rows as `rollup_select` of its samples gives,
    in columns named as the rollup tables name theirs."""
    ns = seconds * 1_000_000_000
    return f"""
SELECT run_id, host, gpu, pid, metric,
       fromUnixTimestamp64Nano(intDiv(toUnixTimestamp64Nano(ts), {ns}) * {ns}, 'UTC') AS ts,
       min(min) AS min, max(max) AS max, sum(sum) AS sum, sum(count) AS count
FROM {source}
GROUP BY run_id, host, gpu, pid, metric, ts
"""


ROLLUPS = {name: rollup_tables(name, seconds) for name, seconds in ROLLUP_SECONDS.items()}
# what migration 2 made (it shipped, so it keeps making it): a rollup per second and per minute
SHIPPED_ROLLUP_SECONDS = {"samples_1s": 1, "samples_1m": 60}
