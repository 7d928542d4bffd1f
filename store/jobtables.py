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
    rank UInt32,
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

JOB_TABLES = (JOBS, JOB_STEPS)
