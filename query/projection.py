"""The SQL of NVTX→GPU projection and phases: marked ranges (NVTX ranges, phases, steps) with
the GPU work launched from inside them, the busy % of the GPU inside them and the host's
telemetry there. Pure: text and bound parameters."""

from __future__ import annotations

from collections.abc import Sequence

from query.gpuwork import NS, RANGE_KINDS, SCOPE, TRACED_RUNS, WORK_KINDS, Query, lent, own
from query.kept import KEEP_SETTINGS, keep_token, kept_runs, of_kept
from query.sql import capped_sum
from query.window import COMPLETE, Predicates

_THREAD = "cityHash64(host, scope, pid, tid)"  # a range's thread, in its scope, as one key
_LEVEL = "cityHash64(kind, style, depth)"  # a range's level on its thread, as one key


def _gpu_key(host: str, gpu: str) -> str:
    """A GPU (host and index) as one key; the host's hash comes from its dictionary, not each row."""
    return f"cityHash64(cityHash64({host}), {gpu})"


# telemetry inside phases: each metric's columns are named for it and its unit (gpu.util_pct -> gpu_util_pct_avg)
PHASE_METRICS = {metric.replace(".", "_"): metric for metric in ("gpu.util_pct", "gpu.mem_used_bytes", "gpu.power_w")}
# the span of the ranges (CTE `ranges`), and the telemetry phases reads: samples of its metrics on the
# ranges' hosts' GPUs inside it
_RANGES_FROM = "fromUnixTimestamp64Nano((SELECT min(rs) FROM ranges), 'UTC')"
_RANGES_TO = "fromUnixTimestamp64Nano((SELECT max(re) FROM ranges), 'UTC')"
_PHASE_TELEMETRY = (
    "metric IN (" + ", ".join(f"'{m}'" for m in PHASE_METRICS.values()) + ") AND gpu >= 0 "
    f"AND host IN (SELECT DISTINCT host FROM ranges) AND ts >= {_RANGES_FROM} AND ts < {_RANGES_TO}"
)


def _ranges(where: Predicates, materialized: bool = False, one_thread: bool = False, besides: str = "1") -> str:
    """CTE `ranges`: NVTX ranges, phases and steps in the window (and `besides`); with `one_thread`, only
    those that end on the thread they start on (Nsight Systems projects no start/end range that ends on
    another). Materialized (computed once, not once per reference) where the query says
    SETTINGS enable_materialized_cte = 1."""
    return f"""
ranges AS {"MATERIALIZED " if materialized else ""}(
    SELECT id AS range_id, run_id, host, {SCOPE} AS scope, kind, name, pid, tid, depth,
           extras['style'] AS style, {NS}(start) AS rs, {NS}(end) AS re
    FROM {{db}}.events WHERE kind IN {RANGE_KINDS} AND {where.sql()} AND {besides}
    {"AND NOT mapContains(extras, 'end_tid')" if one_thread else ""}
)"""


def _levels_join(left: str, time: str, ranges: str = "ranges") -> str:
    """ASOF-join `left` rows (of GPU work, each with its `thread`: the hash of its host, scope, process and
    thread) to the ranges containing `time`. Ranges in one lane (thread, kind, style, depth) never overlap,
    so per lane the latest range starting at or before the time is the only candidate; every row is tried
    against every lane. (A step and the phases inside it overlap at depth 0: their kinds keep them in lanes
    of their own.) The lane is joined on its 64-bit hash: one integer key is several times faster than seven
    columns."""
    return f"""
(SELECT *, cityHash64(thread, level) AS lane FROM ({left})
 ARRAY JOIN (SELECT groupUniqArray({_LEVEL}) FROM {ranges}) AS level) AS w
ASOF INNER JOIN (SELECT range_id, rs, re, cityHash64({_THREAD}, {_LEVEL}) AS lane FROM {ranges}) AS r
    ON w.lane = r.lane AND w.{time} >= r.rs"""


def _projection(ranges: str) -> str:
    """CTEs `projected` and `projection`: each range of `ranges` with the GPU work launched
    from inside it (same host, scope, process and thread). Work of a run with ranges in `ranges` is
    seen in its run's scope, other work only in scope '' (lent), where ranges of a run without a trace
    are: one pass over the work either way."""
    work = f"""
SELECT cityHash64(host, if({own(ranges)}, {SCOPE}, ''), pid, tid) AS thread, kind = 'kernel' AS kernel,
       {NS}(launch_start) AS ls, {NS}(start) AS s, {NS}(end) AS e
FROM {{db}}.events
WHERE kind IN {WORK_KINDS} AND launch_start IS NOT NULL AND {COMPLETE}
  AND (SELECT count() > 0 FROM {ranges}) AND host IN (SELECT DISTINCT host FROM {ranges})
  AND launch_start >= fromUnixTimestamp64Nano((SELECT min(rs) FROM {ranges}), 'UTC')
  AND launch_start < fromUnixTimestamp64Nano((SELECT max(re) FROM {ranges}), 'UTC')
  AND ({own(ranges)} OR {lent(ranges)})"""
    return f"""
projected AS (
    SELECT r.range_id AS range_id, min(w.s) AS first_start, max(w.e) AS last_end, count() AS ops,
           countIf(w.kernel) AS kernel_ops
    FROM {_levels_join(work, "ls", ranges)}
    WHERE w.ls < r.re
    GROUP BY r.range_id
),
projection AS (
    SELECT {ranges}.*, p.ops AS ops, p.kernel_ops AS kernel_ops,
           if(p.ops > 0, p.first_start, NULL) AS first_start, if(p.ops > 0, p.last_end, NULL) AS last_end,
           last_end - first_start AS projected
    FROM {ranges} LEFT JOIN projected AS p USING range_id
)"""


def keep_ranges(run_id: str, generation: int) -> Query:
    """INSERT of a run's ranges with their projection into `kept_ranges` (query/kept.py): a traced run's
    ranges meet its own GPU work only, so their projection is fixed while the run's rows are."""
    where = Predicates()
    where.add("run_id = {run_id:String}", run_id=run_id)
    sql = f"""
INSERT INTO {{db}}.kept_ranges (run_id, host, gpu, start, end, range_id, kind, name, style, depth, pid, tid, ops,
                                kernel_ops, first_start, last_end, generation)
WITH {_ranges(where, materialized=True, one_thread=True)},
{_projection("ranges")}
SELECT run_id, host, -1, fromUnixTimestamp64Nano(rs, 'UTC'), fromUnixTimestamp64Nano(re, 'UTC'), range_id, kind, name,
       style, depth, pid, tid, ops, kernel_ops, first_start, last_end, {{generation:UInt64}}
FROM projection ORDER BY range_id
SETTINGS enable_materialized_cte = 1, {KEEP_SETTINGS}"""
    return sql, {**where.params, "generation": generation, "token": keep_token("kept_ranges", run_id, generation)}


def kept_in_window(where: Predicates) -> Query:
    """The runs with ranges in the window: (run_id, generation, kept), kept when what is kept of the run is of
    its rows as they are now."""
    in_window = f"SELECT DISTINCT run_id FROM {{db}}.events WHERE kind IN {RANGE_KINDS} AND {where.sql()}"
    return kept_runs(in_window), where.params


def nvtx_gpu_summary(where: Predicates, kept: Sequence[tuple[str, int]] = (), others: bool = True) -> Query:
    """Per range name and style (as nvtx_gpu_proj_sum): instances, range time, and the projected GPU
    time of the ranges: those of the `kept` runs (run id, generation) as kept, and with `others` the other
    runs' made now."""
    made = []
    kept_rows, kept_params = of_kept(kept)
    if others or not kept:
        besides = "run_id NOT IN {kept_run_ids:Array(String)}" if kept else "1"
        made.append(f"""
WITH {_ranges(where, materialized=True, one_thread=True, besides=besides)},
{_projection("ranges")}
SELECT name, style, rs, re, ops, kernel_ops, projected FROM projection""")
    if kept:
        made.append(f"""
SELECT name, style, {NS}(start) AS rs, {NS}(end) AS re, ops, kernel_ops, last_end - first_start AS projected
FROM {{db}}.kept_ranges
WHERE {kept_rows} AND {where.sql()}""")
    together = "\nUNION ALL\n".join(f"SELECT * FROM ({part})" for part in made)
    # output names never reuse an input column's name: ClickHouse would read the alias instead
    sql = f"""
SELECT name, style, count() AS instances, countIf(ops > 0) AS with_gpu_work, {capped_sum("re - rs")} AS range_total_ns,
       if(countIf(ops > 0) = 0, NULL, {capped_sum("projected")}) AS gpu_total_ns, avg(projected) AS gpu_avg_ns,
       quantileExactInclusive(0.5)(projected) AS gpu_med_ns, min(projected) AS gpu_min_ns,
       max(projected) AS gpu_max_ns,
       multiIf(countIf(ops > 0) > 1, stddevSamp(projected), countIf(ops > 0) = 1, 0, NULL) AS gpu_stddev_ns,
       sum(ops) AS gpu_ops, sum(kernel_ops) AS kernels
FROM ({together}) GROUP BY name, style ORDER BY gpu_total_ns DESC, name, style
SETTINGS enable_materialized_cte = 1"""
    return sql, {**where.params, **kept_params}


def nvtx_gpu_ranges(where: Predicates, limit: int) -> Query:
    """The first `limit` ranges in start order, each with its projection: only their work is read."""
    sql = f"""
WITH {_ranges(where, one_thread=True)},
first_ranges AS (SELECT * FROM ranges ORDER BY rs, range_id LIMIT {{limit:UInt32}}),
{_projection("first_ranges")}
SELECT range_id, kind, name, style, depth, pid, tid, rs AS start_ns, re AS end_ns, re - rs AS duration_ns,
       first_start AS gpu_start_ns, last_end AS gpu_end_ns, projected AS gpu_duration_ns, ops AS gpu_ops,
       kernel_ops AS kernels
FROM projection ORDER BY rs, range_id"""
    return sql, {**where.params, "limit": limit}


def phases(where: Predicates) -> Query:
    """Per range name, host and GPU: instances, time, the busy % of the GPU inside them, and
    the host's NVML telemetry inside them.

    A range belongs to the GPUs its process ran work on (all the host's GPUs when it ran
    none). Busy % is NULL for names whose ranges come from no trace and have no GPU work on
    record on their host (phases of agent.training with no trace beside them): unknown,
    not idle. The range borders
    cut each GPU's time into segments. Busy time before each border comes from one sorted
    pass over the work and the borders together; an instance's busy time is the difference at
    its two borders. Each segment knows the set of names covering
    it (its cover); one ASOF join puts each sample in its segment, so every sample is read
    once whatever the number of names, and counts once per name covering it."""
    in_ranges = (
        f"host IN (SELECT DISTINCT host FROM ranges) AND end > {_RANGES_FROM} AND start < {_RANGES_TO} AND {COMPLETE}"
    )
    met = f"({own('ranges')} OR {lent('ranges')})"  # work the ranges meet
    order = "PARTITION BY key ORDER BY t, border, e"
    # samples are summed up per segment with each metric's count, sum and top apart (by its number m), not
    # grouped by the metric's name as well: a third key, and a string, costs more than the join
    numbered = " ".join(f"metric = '{metric}', {m}," for m, metric in enumerate(PHASE_METRICS.values()))
    per_segment = ",\n           ".join(
        f"countIf(m = {m}) AS {name}_count, sumIf(value, m = {m}) AS {name}_total, "
        f"maxIfOrNull(value, m = {m}) AS {name}_top"
        for m, name in enumerate(PHASE_METRICS)
    )
    telemetry = ",\n       ".join(
        f"sum({name}_count) AS {name}_n, sum({name}_total) AS {name}_sum, max({name}_top) AS {name}_max"
        for name in PHASE_METRICS
    )
    counted = " + ".join(f"{name}_count" for name in PHASE_METRICS)
    results = ", ".join(
        f"if(i.{n}_n > 0, i.{n}_sum / i.{n}_n, NULL) AS {n}_avg, if(i.{n}_n > 0, i.{n}_max, NULL) AS {n}_max"
        for n in PHASE_METRICS
    )
    sql = f"""
WITH {_ranges(where, materialized=True)},
process_gpus AS MATERIALIZED (  -- the GPUs each process ran work on, in each scope its work is seen in
    SELECT DISTINCT host, {SCOPE} AS scope, pid, gpu FROM {{db}}.events
    WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND {in_ranges} AND {own("ranges")}
    UNION DISTINCT
    SELECT DISTINCT host, '' AS scope, pid, gpu FROM {{db}}.events
    WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND {in_ranges} AND {lent("ranges")}
),
host_gpus AS MATERIALIZED (
    SELECT DISTINCT host, gpu FROM process_gpus
    UNION DISTINCT
    SELECT DISTINCT host, gpu FROM {{db}}.samples WHERE {_PHASE_TELEMETRY}
),
instances AS MATERIALIZED (  -- each range on each GPU it belongs to; key: the GPU
    SELECT r.range_id AS range_id, {_gpu_key("g.host", "g.gpu")} AS key, r.rs AS rs, r.re AS re
    FROM ranges AS r INNER JOIN process_gpus AS g ON g.host = r.host AND g.scope = r.scope AND g.pid = r.pid
    UNION ALL
    SELECT r.range_id, {_gpu_key("g.host", "g.gpu")}, r.rs, r.re
    FROM ranges AS r INNER JOIN host_gpus AS g ON g.host = r.host
    WHERE (r.host, r.scope, r.pid) NOT IN (SELECT host, scope, pid FROM process_gpus)
),
stream AS (  -- the work's intervals, and the instances' borders as rows of their own (border = 1)
    SELECT {_gpu_key("host", "gpu")} AS key, {NS}(start) AS t, {NS}(end) AS e, 0 AS border, 0 AS sign,
           0 AS range_id FROM {{db}}.events
    WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND {in_ranges} AND e > t AND {met}
    UNION ALL
    SELECT key, border.1, 0, 1, border.2, range_id FROM instances ARRAY JOIN [(rs, -1), (re, 1)] AS border
),
reached AS (  -- reach: the latest end of the work before each row
    SELECT key, t, e, border, sign, range_id,
           max(e) OVER ({order} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM stream
),
borders AS MATERIALIZED (  -- busy: GPU time covered before t (work adds what it covers past the reach);
    -- n: how many borders lie at or before t, the same for borders at one time
    SELECT key, t, sign, range_id, n, covered - greatest(0, reach - t) AS busy FROM (
        SELECT key, t, border, sign, range_id, reach,
               sum(if(border = 0, greatest(0, e - greatest(t, reach)), 0)) OVER ({order} ROWS UNBOUNDED PRECEDING)
                   AS covered,
               sum(border) OVER ({order} RANGE UNBOUNDED PRECEDING) AS n
        FROM reached
    ) WHERE border = 1
),
spans AS MATERIALIZED (  -- each instance: its length, busy time, and the numbers of its borders
    SELECT key, range_id, sum(sign * t) AS length, sum(sign * busy) AS busy, min(n) AS first, max(n) AS last
    FROM borders GROUP BY key, range_id
),
covers AS MATERIALIZED (  -- segment n runs from the borders numbered n to the next ones
    SELECT key, n, arraySort(arrayDistinct(groupArray(name))) AS names, cityHash64(names) AS cover
    FROM (SELECT s.key AS key, r.name AS name, arrayJoin(range(s.first, s.last)) AS n
          FROM spans AS s INNER JOIN ranges AS r USING (range_id))
    GROUP BY key, n
),
segments AS (  -- every border time starts a segment; cover 0: no range covers it
    SELECT b.key AS key, b.t AS s, c.cover AS cover
    FROM (SELECT DISTINCT key, t, n FROM borders) AS b LEFT JOIN covers AS c ON c.key = b.key AND c.n = b.n
),
inside AS (
    SELECT key, cover,
           {per_segment}
    FROM (SELECT {_gpu_key("host", "gpu")} AS key, multiIf({numbered} -1) AS m, {NS}(ts) AS t, value FROM {{db}}.samples
          WHERE {_PHASE_TELEMETRY}) AS w
    ASOF INNER JOIN segments AS g ON g.key = w.key AND w.t >= g.s
    WHERE cover != 0
    GROUP BY key, cover
),
gpus AS (SELECT DISTINCT host, gpu, {_gpu_key("host", "gpu")} AS key FROM host_gpus),
named AS (
    SELECT name, key, sum({counted}) AS samples,
       {telemetry}
    FROM inside INNER JOIN (SELECT DISTINCT key, cover, names FROM covers) AS c USING (key, cover)
    ARRAY JOIN names AS name
    GROUP BY name, key
)
SELECT s.name AS name, g.host AS host, g.gpu AS gpu, s.instances AS instances, s.total_ns AS total_ns,
       if(s.total_ns > 0 AND s.traced > 0, 100 * toFloat64(s.busy_ns) / s.total_ns, NULL) AS busy_pct,
       i.samples AS samples,
       {results}
FROM (SELECT r.name AS name, key, count() AS instances, {capped_sum("length")} AS total_ns,
             {capped_sum("busy")} AS busy_ns,
             countIf(r.run_id IN {TRACED_RUNS} OR (r.host, r.scope) IN (SELECT host, scope FROM process_gpus))
                 AS traced  -- from a trace, or with GPU work on record on the host
      FROM spans AS s INNER JOIN ranges AS r USING (range_id) GROUP BY name, key) AS s
INNER JOIN gpus AS g ON g.key = s.key
LEFT JOIN named AS i ON i.name = s.name AND i.key = s.key
ORDER BY total_ns DESC, name, host, gpu
SETTINGS enable_materialized_cte = 1"""
    return sql, where.params


def phase_telemetry(where: Predicates) -> Query:
    """The fingerprint of the telemetry `phases` reads for the ranges in the window (samples never change:
    rows are added, or taken by retention oldest first, so their count and earliest time tell)."""
    sql = f"""
WITH {_ranges(where)}
SELECT cityHash64(count(), min(ts)) AS telemetry FROM {{db}}.samples WHERE {_PHASE_TELEMETRY}"""
    return sql, where.params
