"""The tables of distributed jobs (query/jobassemble.py fills them): each rank of a job with the clock
alignment used for it, and each rank's steps in parts. Both are made from the ranks' runs and events
when a job is first asked about, and again when one of its runs changes (a new `generation`)."""

from __future__ import annotations

from store.schema import Table

JOBS = Table(
    "jobs",
    """
    job String COMMENT 'the job id its runs name (attrs job)',
    generation String COMMENT 'fingerprint of the runs it was made from; the latest assembled is the answer',
    rank UInt32 COMMENT '4294967295: a row of the job''s own notes (bad input and what was done)',
    run_id String,
    host LowCardinality(String),
    gpu Int16 COMMENT 'the GPU the rank ran on: most of its kernels, else its local rank; -1 for none',
    world_size UInt32 COMMENT 'what the rank said; 0 when it said nothing',
    local_rank Int32 COMMENT '-1 when unknown',
    steps UInt32 COMMENT 'steps found in its run',
    offset_ns Int64 COMMENT 'added to the rank''s times to put them on the reference rank''s clock',
    uncertainty_ns Int64 COMMENT 'how far the offset may be off (a robust spread); -1: not aligned',
    alignment LowCardinality(String) COMMENT 'reference, same host, collective ends, agent offsets or none',
    note String COMMENT 'what was done about this rank, if anything',
    assembled DateTime64(9, 'UTC')
""",
    "MergeTree",
    order_by="(job, generation, rank)",
    comment="each rank of a distributed job: its run, host, GPU and clock alignment",
    shard_key="cityHash64(job)",
    dedup=False,
)

JOB_STEPS = Table(
    "job_steps",
    """
    job LowCardinality(String),
    generation LowCardinality(String),
    rank UInt32,
    step Int64,
    start DateTime64(9, 'UTC') COMMENT 'on the rank''s own clock (jobs.offset_ns aligns it)' CODEC(Delta, ZSTD(1)),
    dur_ns Int64 COMMENT 'the step''s time' CODEC(T64, ZSTD(1)),
    compute_ns Int64 COMMENT 'compute: GPU work other than collectives (host ops on a rank with no GPU work)'
        CODEC(T64, ZSTD(1)),
    comm_ns Int64 COMMENT 'exposed communication: in collectives, not overlapped by compute' CODEC(T64, ZSTD(1)),
    data_ns Int64 COMMENT 'data loading (and the host) not overlapped by either' CODEC(T64, ZSTD(1)),
    idle_ns Int64 COMMENT 'the rest of the step' CODEC(T64, ZSTD(1))
""",
    "MergeTree",
    order_by="(job, generation, rank, step)",
    comment="each rank's steps of a distributed job, in parts that add up to the step's time",
    shard_key="cityHash64(job)",
    dedup=False,
)

JOB_COLLECTIVES = Table(
    "job_collectives",
    """
    job String,
    generation String,
    kind LowCardinality(String) COMMENT 'all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, ...',
    bytes UInt64 COMMENT 'its size (the largest a rank gave); 0: unknown',
    count UInt64 COMMENT 'collectives of this kind and size matched across two ranks or more',
    ranks UInt32,
    latency_ns Int64 COMMENT 'median over ranks and collectives of end - start',
    arrival_skew_ns Int64 COMMENT 'median spread of the ranks'' aligned starts',
    arrival_skew_max_ns Int64,
    finish_skew_ns Int64 COMMENT 'median spread of the ranks'' aligned ends',
    algbw_bytes_per_s UInt64 COMMENT 'bytes over the time from the last arrival to the last end (nccl-tests)',
    busbw_bytes_per_s UInt64 COMMENT 'algbw times the kind''s factor for its ranks (nccl-tests)',
    last_rank Int32 COMMENT 'the rank that arrived last most often',
    last_rank_count UInt64
""",
    "MergeTree",
    order_by="(job, generation, kind, bytes)",
    comment="a distributed job's collectives per kind and size, across its ranks",
    shard_key="cityHash64(job)",
    dedup=False,
)

JOB_TABLES = (JOBS, JOB_STEPS, JOB_COLLECTIVES)
