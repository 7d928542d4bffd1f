"""The SQL of the analyses over one timeline. Pure: text and bound parameters.

Every analysis runs inside the store as set-based SQL: window functions make the union of
GPU intervals ("islands" of busy time), ASOF joins tie GPU work to the NVTX ranges it was
launched from and samples to the ranges they fall in, prefix sums give busy time inside
any interval. Times in results are ns since the epoch (Int64).
"""

from __future__ import annotations

from query.window import Predicates

WORK_KINDS = "('kernel', 'memcpy', 'memset')"
RANGE_KINDS = "('nvtx', 'phase')"
NS = "toUnixTimestamp64Nano"
PHASE_METRICS = {"sm_util": "gpu.util_pct", "mem_used": "gpu.mem_used_bytes", "power": "gpu.power_w"}

Query = tuple[str, dict[str, object]]


def _work(where: Predicates, clip_from: int | None, clip_to: int | None) -> str:
    """GPU work (kernels and memory operations) in the window, clipped to it."""
    start, end = f"{NS}(start)", f"{NS}(end)"
    if clip_from is not None:
        where.params["clip_from"] = clip_from
        start = f"greatest({start}, {{clip_from:Int64}})"
    if clip_to is not None:
        where.params["clip_to"] = clip_to
        end = f"least({end}, {{clip_to:Int64}})"
    return f"""
SELECT host, gpu, {start} AS s, {end} AS e FROM {{db}}.events
WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND {where.sql()}"""


def islands(work: str) -> str:
    """CTE `islands(host, gpu, s, e)`: the union of the work's intervals per GPU, as disjoint
    intervals. A row starts an island when it starts after every earlier row has ended."""
    order = "PARTITION BY host, gpu ORDER BY s, e"
    return f"""
islands AS (
    SELECT host, gpu, min(s) AS s, max(e) AS e FROM (
        SELECT host, gpu, s, e, sum(starts) OVER ({order} ROWS UNBOUNDED PRECEDING) AS island FROM (
            SELECT host, gpu, s, e,
                   row_number() OVER ({order}) = 1
                   OR s > max(e) OVER ({order} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS starts
            FROM ({work}) WHERE e > s
        )
    ) GROUP BY host, gpu, island
)"""


def gpu_time(where: Predicates, clip_from: int | None, clip_to: int | None) -> Query:
    span_start = "{clip_from:Int64}" if clip_from is not None else "min(s)"
    span_end = "{clip_to:Int64}" if clip_to is not None else "max(e)"
    sql = f"""
WITH {islands(_work(where, clip_from, clip_to))}
SELECT host, gpu, span_start_ns, span_end_ns, busy_ns, span_end_ns - span_start_ns - busy_ns AS idle_ns,
       100 * busy_ns / (span_end_ns - span_start_ns) AS busy_pct, islands
FROM (SELECT host, gpu, {span_start} AS span_start_ns, {span_end} AS span_end_ns, sum(e - s) AS busy_ns,
             count() AS islands
      FROM islands GROUP BY host, gpu)
ORDER BY host, gpu"""
    return sql, where.params


def _gaps(where: Predicates, clip_from: int | None, clip_to: int | None) -> str:
    """CTE text: `gaps(host, gpu, start_ns, end_ns, length_ns)`, the idle time between islands."""
    return f"""{islands(_work(where, clip_from, clip_to))},
gaps AS (
    SELECT host, gpu, e AS start_ns, next_s AS end_ns, next_s - e AS length_ns FROM (
        SELECT host, gpu, e,
               leadInFrame(s) OVER (PARTITION BY host, gpu ORDER BY s ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING)
                   AS next_s,
               row_number() OVER (PARTITION BY host, gpu ORDER BY s DESC) AS from_last
        FROM islands)
    WHERE from_last > 1
)"""


def gpu_gaps(where: Predicates, clip_from: int | None, clip_to: int | None, min_gap: int, limit: int) -> Query:
    sql = f"""
WITH {_gaps(where, clip_from, clip_to)}
SELECT host, gpu, start_ns, end_ns, length_ns FROM gaps WHERE length_ns > {{min_gap:Int64}}
ORDER BY length_ns DESC, host, gpu, start_ns LIMIT {{limit:UInt32}}"""
    return sql, {**where.params, "min_gap": min_gap, "limit": limit}


def _ranges(where: Predicates) -> str:
    return f"""
ranges AS (
    SELECT id AS range_id, run_id, host, name, pid, tid, depth, extras['style'] AS style,
           {NS}(start) AS rs, {NS}(end) AS re
    FROM {{db}}.events WHERE kind IN {RANGE_KINDS} AND {where.sql()}
)"""


def _levels_join(left: str, time: str) -> str:
    """ASOF-join `left` rows to the ranges containing `time`. Ranges in one lane (thread,
    style, depth) never overlap, so per lane the latest range starting at or before the time
    is the only candidate; every row is tried against every lane."""
    return f"""
(SELECT *, lane.1 AS lane_style, lane.2 AS lane_depth FROM ({left})
 ARRAY JOIN (SELECT groupUniqArray((style, depth)) FROM ranges) AS lane) AS w
ASOF INNER JOIN ranges AS r
    ON w.run_id = r.run_id AND w.pid = r.pid AND w.tid = r.tid
    AND w.lane_style = r.style AND w.lane_depth = r.depth AND w.{time} >= r.rs"""


def nvtx_gpu(where: Predicates, limit: int) -> tuple[Query, Query]:
    """(summary per name, ranges in start order): GPU work launched from inside each range."""
    work = f"""
SELECT run_id, pid, tid, kind, {NS}(launch_start) AS ls, {NS}(start) AS s, {NS}(end) AS e
FROM {{db}}.events
WHERE kind IN {WORK_KINDS} AND launch_start IS NOT NULL
  AND run_id IN (SELECT DISTINCT run_id FROM ranges)
  AND launch_start >= fromUnixTimestamp64Nano((SELECT min(rs) FROM ranges), 'UTC')
  AND launch_start < fromUnixTimestamp64Nano((SELECT max(re) FROM ranges), 'UTC')"""
    common = f"""
WITH {_ranges(where)},
projected AS (
    SELECT r.range_id AS range_id, min(w.s) AS first_start, max(w.e) AS last_end, count() AS ops,
           countIf(w.kind = 'kernel') AS kernel_ops
    FROM {_levels_join(work, "ls")}
    WHERE w.ls < r.re
    GROUP BY r.range_id
),
projection AS (
    SELECT ranges.*, p.ops AS ops, p.kernel_ops AS kernel_ops,
           if(p.ops > 0, p.first_start, NULL) AS first_start, if(p.ops > 0, p.last_end, NULL) AS last_end,
           last_end - first_start AS projected
    FROM ranges LEFT JOIN projected AS p USING range_id
)"""
    # output names never reuse an input column's name: ClickHouse would read the alias instead
    summary = f"""{common}
SELECT name, count() AS instances, countIf(ops > 0) AS with_gpu_work, sum(re - rs) AS range_total_ns,
       sum(projected) AS gpu_total_ns, avg(projected) AS gpu_avg_ns,
       quantileExactInclusive(0.5)(projected) AS gpu_med_ns, min(projected) AS gpu_min_ns,
       max(projected) AS gpu_max_ns, if(countIf(ops > 0) > 1, stddevSamp(projected), 0) AS gpu_stddev_ns,
       sum(ops) AS gpu_ops, sum(kernel_ops) AS kernels
FROM projection GROUP BY name ORDER BY gpu_total_ns DESC, name"""
    trace = f"""{common}
SELECT range_id, name, style, depth, pid, tid, rs AS start_ns, re AS end_ns, re - rs AS duration_ns,
       first_start AS gpu_start_ns, last_end AS gpu_end_ns, projected AS gpu_duration_ns, ops AS gpu_ops,
       kernel_ops AS kernels
FROM projection ORDER BY rs, range_id LIMIT {{limit:UInt32}}"""
    return (summary, dict(where.params)), (trace, {**where.params, "limit": limit})


def phases(where: Predicates) -> Query:
    """Per range name and GPU of its host: instances, time, the busy % inside its intervals of
    the GPU work of the ranges' runs, and the NVML telemetry of the host inside them."""
    metrics = ", ".join(f"'{m}'" for m in PHASE_METRICS.values())
    work = f"""
SELECT host, gpu, {NS}(start) AS s, {NS}(end) AS e FROM {{db}}.events
WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND run_id IN (SELECT DISTINCT run_id FROM ranges)
  AND end > fromUnixTimestamp64Nano((SELECT min(rs) FROM ranges), 'UTC')
  AND start < fromUnixTimestamp64Nano((SELECT max(re) FROM ranges), 'UTC')"""
    # every sample of the ranges' hosts, once per thread that has ranges (the join's lanes are per thread)
    samples = f"""
SELECT s.host AS host, s.gpu AS gpu, s.metric AS metric, {NS}(s.ts) AS t, s.value AS value,
       threads.run_id AS run_id, threads.pid AS pid, threads.tid AS tid
FROM {{db}}.samples AS s
CROSS JOIN (SELECT DISTINCT run_id, pid, tid FROM ranges) AS threads
WHERE s.metric IN ({metrics}) AND s.gpu >= 0 AND s.host IN (SELECT DISTINCT host FROM ranges)
  AND s.ts >= fromUnixTimestamp64Nano((SELECT min(rs) FROM ranges), 'UTC')
  AND s.ts < fromUnixTimestamp64Nano((SELECT max(re) FROM ranges), 'UTC')"""
    telemetry = ",\n       ".join(
        f"countIf(metric = '{metric}') AS {name}_n, avgIf(value, metric = '{metric}') AS {name}_avg, "
        f"maxIf(value, metric = '{metric}') AS {name}_max"
        for name, metric in PHASE_METRICS.items()
    )
    sql = f"""
WITH {_ranges(where)},
{islands(work)},
busy_before AS (
    SELECT host, gpu, s, e, sum(e - s) OVER (PARTITION BY host, gpu ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING
                                              AND 1 PRECEDING) AS before
    FROM islands
),
gpus AS (
    SELECT DISTINCT host, gpu FROM islands
    UNION DISTINCT
    SELECT DISTINCT host, gpu FROM {{db}}.samples
    WHERE metric IN ({metrics}) AND gpu >= 0 AND host IN (SELECT DISTINCT host FROM ranges)
      AND ts >= fromUnixTimestamp64Nano((SELECT min(rs) FROM ranges), 'UTC')
      AND ts < fromUnixTimestamp64Nano((SELECT max(re) FROM ranges), 'UTC')
),
instances AS (
    SELECT r.name AS name, r.host AS host, g.gpu AS gpu, r.rs AS rs, r.re AS re
    FROM ranges AS r INNER JOIN gpus AS g ON g.host = r.host
),
busy AS (
    SELECT name, gpu, count() AS instances, sum(re - rs) AS total_ns, sum(until_end - until_start) AS busy_ns
    FROM (
        SELECT i.name AS name, i.gpu AS gpu, i.rs AS rs, i.re AS re, until_start,
               b2.before + least(i.re, b2.e) - b2.s AS until_end
        FROM (
            SELECT i.*, b1.before + least(i.rs, b1.e) - b1.s AS until_start
            FROM instances AS i ASOF LEFT JOIN busy_before AS b1 ON b1.host = i.host AND b1.gpu = i.gpu AND b1.s <= i.rs
        ) AS i
        ASOF LEFT JOIN busy_before AS b2 ON b2.host = i.host AND b2.gpu = i.gpu AND b2.s <= i.re
    ) GROUP BY name, gpu
),
inside AS (
    SELECT name, gpu, count() AS samples,
       {telemetry}
    FROM (  -- a sample inside several instances of one name (on several threads) counts once
        SELECT DISTINCT r.name AS name, w.gpu AS gpu, w.metric AS metric, w.t AS t, w.value AS value
        FROM {_levels_join(samples, "t")}
        WHERE w.t < r.re AND w.host = r.host
    )
    GROUP BY name, gpu
)
SELECT b.name AS name, b.gpu AS gpu, b.instances AS instances, b.total_ns AS total_ns,
       100 * b.busy_ns / b.total_ns AS busy_pct, i.samples AS samples,
       {
        ", ".join(
            f"if(i.{n}_n > 0, i.{n}_avg, NULL) AS {n}_avg, if(i.{n}_n > 0, i.{n}_max, NULL) AS {n}_max"
            for n in PHASE_METRICS
        )
    }
FROM busy AS b LEFT JOIN inside AS i ON i.name = b.name AND i.gpu = b.gpu
ORDER BY total_ns DESC, name, gpu"""
    return sql, where.params


def launch_latency(where: Predicates) -> Query:
    sql = f"""
SELECT name, count() AS kernels, avg(l) AS avg_ns,
       quantileExactInclusive(0.5)(l) AS med_ns, quantileExactInclusive(0.9)(l) AS p90_ns,
       quantileExactInclusive(0.99)(l) AS p99_ns, min(l) AS min_ns, max(l) AS max_ns
FROM (SELECT name, {NS}(start) - {NS}(launch_start) AS l FROM {{db}}.events
      WHERE kind = 'kernel' AND launch_start IS NOT NULL AND {where.sql()})
GROUP BY name ORDER BY kernels DESC, name"""
    return sql, where.params


def short_kernels(where: Predicates, short_ns: int) -> Query:
    sql = f"""
SELECT name, countIf(d < {{short:Int64}}) AS short, count() AS kernels, 100 * short / kernels AS short_pct,
       sumIf(d, d < {{short:Int64}}) AS short_total_ns
FROM (SELECT name, {NS}(end) - {NS}(start) AS d FROM {{db}}.events WHERE kind = 'kernel' AND {where.sql()})
GROUP BY name HAVING short > 0 ORDER BY short DESC, name"""
    return sql, {**where.params, "short": short_ns}


def idle_after_sync(where: Predicates, syncs: Predicates, clip_from: int | None, clip_to: int | None) -> Query:
    """Per GPU: idle time between islands, and the part of it in gaps during which a sync
    ended: the host waited for the GPU to drain, then had to feed it again."""
    sql = f"""
WITH {_gaps(where, clip_from, clip_to)},
sync_ends AS (
    SELECT host, gpu, {NS}(end) AS t FROM {{db}}.events
    WHERE (kind = 'sync' OR (kind = 'cuda_api' AND positionCaseInsensitive(name, 'synchronize') > 0))
      AND {syncs.sql()}
),
device_syncs AS (SELECT host, gpu, t FROM sync_ends WHERE gpu >= 0),
host_syncs AS (SELECT host, t FROM sync_ends WHERE gpu < 0),
judged AS (
    SELECT g.host AS host, g.gpu AS gpu, g.length_ns AS length_ns,
           (g.device_sync >= g.start_ns AND g.device_sync > 0) OR (h.t >= g.start_ns AND h.t > 0) AS after_sync
    FROM (
        SELECT g.host AS host, g.gpu AS gpu, g.start_ns AS start_ns, g.end_ns AS end_ns, g.length_ns AS length_ns,
               d.t AS device_sync
        FROM gaps AS g ASOF LEFT JOIN device_syncs AS d ON d.host = g.host AND d.gpu = g.gpu AND d.t < g.end_ns
    ) AS g
    ASOF LEFT JOIN host_syncs AS h ON h.host = g.host AND h.t < g.end_ns
)
SELECT host, gpu, sum(length_ns) AS idle_ns, sumIf(length_ns, after_sync) AS idle_after_sync_ns,
       100 * idle_after_sync_ns / idle_ns AS after_sync_pct, count() AS gaps, countIf(after_sync) AS gaps_after_sync
FROM judged GROUP BY host, gpu ORDER BY host, gpu"""
    return sql, {**where.params, **syncs.params}


DIFF_CATEGORIES = {"kernels": "'kernel'", "api": "'cuda_api'", "memops": "'memcpy', 'memset'"}


def diff(run_a: str, run_b: str, summaries: list[str], limit: int) -> Query:
    kinds = ", ".join(DIFF_CATEGORIES[s] for s in summaries)
    side = {"a": "{run_a:String}", "b": "{run_b:String}"}
    columns = ",\n       ".join(
        f"countIf(run_id = {run}) AS instances_{k}, sumIf(d, run_id = {run}) AS total_ns_{k}, "
        f"if(instances_{k} > 0, avgIf(d, run_id = {run}), NULL) AS avg_ns_{k}"
        for k, run in side.items()
    )
    sql = f"""
SELECT category, name,
       {columns},
       total_ns_b - total_ns_a AS delta_ns,
       if(total_ns_a > 0, 100 * (total_ns_b - total_ns_a) / total_ns_a, NULL) AS delta_pct
FROM (
    SELECT multiIf(kind = 'kernel', 'kernels', kind = 'cuda_api', 'api', 'memops') AS category, name, run_id,
           {NS}(end) - {NS}(start) AS d
    FROM {{db}}.events WHERE run_id IN ({{run_a:String}}, {{run_b:String}}) AND kind IN ({kinds})
)
GROUP BY category, name
ORDER BY abs(delta_ns) DESC, category, name
{"LIMIT {limit:UInt32}" if limit else ""}"""
    return sql, {"run_a": run_a, "run_b": run_b, "limit": limit}


def range_instance(where: Predicates, name: str, instance: int) -> Query:
    sql = f"""
SELECT {NS}(start) AS s, {NS}(end) AS e, count() OVER () AS instances FROM {{db}}.events
WHERE kind IN {RANGE_KINDS} AND name = {{range_name:String}} AND {where.sql()}
ORDER BY start, id LIMIT 1 OFFSET {{offset:UInt64}}"""
    return sql, {**where.params, "range_name": name, "offset": instance - 1}
