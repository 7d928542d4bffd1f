"""The rollups of a group's samples, made where the group is stored: per series and per bucket of
`tracehouse.model.ROLLUP_SECONDS`, the min, max, sum and count of the values. The rollup tables are
AggregatingMergeTrees, so the rows of each group add up to those of all samples, whatever groups
they came in. Made here, not by materialized views: a view runs a pipeline of its own on every
insert, 0.4 to 0.6 µs a value; this takes 0.1 to 0.2 (tracehouse bench load --writers)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tracehouse.model import ROLLUP_SECONDS

SERIES = ["run_id", "host", "gpu", "pid", "metric"]
_TIMESTAMP = pa.timestamp("ns", tz="UTC")


def rollups(samples: pa.Table) -> dict[str, pa.Table]:
    """The rows of each rollup table for `samples` (columns as the tables name them), finest first;
    each coarser one is summed up from the one before, which gives the same rows."""
    made: dict[str, pa.Table] = {}
    finer: pa.Table | None = None
    for name, seconds in sorted(ROLLUP_SECONDS.items(), key=lambda item: item[1]):
        source = samples if finer is None else finer
        if finer is None:
            measures = [("value", "min"), ("value", "max"), ("value", "sum"), ("value", "count")]
        else:
            measures = [("min", "min"), ("max", "max"), ("sum", "sum"), ("count", "sum")]
        grouped = (
            source.select([*SERIES, *{column for column, _ in measures}])
            .append_column("bucket", _bucket(source.column("ts"), seconds))
            .group_by([*SERIES, "bucket"], use_threads=False)
            .aggregate(measures)
        )
        finer = made[name] = pa.table(
            {
                **{column: grouped.column(column) for column in SERIES},
                "ts": grouped.column("bucket").cast(_TIMESTAMP),
                "min": grouped.column(f"{measures[0][0]}_min"),
                "max": grouped.column(f"{measures[1][0]}_max"),
                "sum": grouped.column(f"{measures[2][0]}_sum"),
                "count": grouped.column(f"{measures[3][0]}_{measures[3][1]}").cast(pa.uint64()),
            }
        )
    return made


def _bucket(ts: pa.ChunkedArray, seconds: int) -> pa.ChunkedArray:
    """The start of each instant's bucket, in ns (instants are never before 1970: validate.py)."""
    width = seconds * 1_000_000_000
    return pc.multiply(pc.divide(ts.cast(pa.int64()), width), width)
