"""The SQL of the analyses over one timeline. Pure: text and bound parameters.

Every analysis runs inside the store as set-based SQL: a running maximum of GPU work's end
times finds its idle gaps, ASOF joins tie GPU work to the NVTX ranges it was launched from
and samples to the ranges they fall in, running sums give busy time inside any interval.
Times in results are ns since the epoch (Int64).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.metrics import GPU_ENERGY, GPU_SM_ACTIVE, GPU_UTIL, PROC_GPU_MEM, PROC_SM_UTIL
from query.sql import capped_sum, tag_predicates
from query.window import COMPLETE, Predicates, ns
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.timefmt import NS_PER_S

GPU_WORK = ("kernel", "memcpy", "memset")
WORK_KINDS = "(" + ", ".join(f"'{kind}'" for kind in GPU_WORK) + ")"  # as SQL
# ranges a person marked: NVTX ranges (nsys), and the phases and steps of tracehouse.training
RANGE_KINDS = "('nvtx', 'phase', 'step')"
NS = "toUnixTimestamp64Nano"
PHASE_METRICS = {"sm_util": "gpu.util_pct", "mem_used": "gpu.mem_used_bytes", "power": "gpu.power_w"}

Query = tuple[str, dict[str, object]]

# Ranges meet GPU work on their host, process and thread, whatever run each came in: phases of
# tracehouse.training and the kernels of a trace of the same process are two runs. Runs whose
# times count from an unknown origin (nsys before 2021.3) only meet their own rows.
RELATIVE_RUNS = "(SELECT run_id FROM {db}.runs FINAL WHERE relative_time)"
SCOPE = f"if(run_id IN {RELATIVE_RUNS}, run_id, '')"
TRACED_RUNS = "(SELECT run_id FROM {db}.runs FINAL WHERE source IN ('nsys', 'kineto'))"


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


def _reach(work: str, keys: str = "host, gpu") -> str:
    """CTE `reach(<keys>, s, e, reach)`: each interval with the latest end of those sorted
    before it on its GPU (`keys`). Where it starts after that reach, the GPU was idle in
    [reach, s): a gap (the first interval's empty frame gives reach 0, and no interval ends at 0)."""
    return f"""
reach AS (
    SELECT {keys}, s, e,
           max(e) OVER (PARTITION BY {keys} ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM ({work}) WHERE e > s
)"""


GAP = "reach > 0 AND s > reach"


def _gaps(where: Predicates, clip_from: int | None, clip_to: int | None) -> str:
    """CTE text: `gaps(host, gpu, start_ns, end_ns, length_ns)`, the idle time between islands."""
    return f"""{_reach(_work(where, clip_from, clip_to))},
gaps AS (SELECT host, gpu, reach AS start_ns, s AS end_ns, s - reach AS length_ns FROM reach WHERE {GAP})"""


def gpu_time(where: Predicates, clip_from: int | None, clip_to: int | None, min_gap: int, max_gaps: int) -> Query:
    """Per GPU: span, busy, idle, busy %, islands, and its `max_gaps` longest gaps over
    `min_gap` as an array; one pass over the work. Busy time is the union's extent less its
    gaps."""
    span_start = "{clip_from:Int64}" if clip_from is not None else "first"
    span_end = "{clip_to:Int64}" if clip_to is not None else "last"
    sql = f"""
WITH {_reach(_work(where, clip_from, clip_to))}
SELECT host, gpu, span_start_ns, span_end_ns, busy_ns, span_end_ns - span_start_ns - busy_ns AS idle_ns,
       100 * busy_ns / (span_end_ns - span_start_ns) AS busy_pct, islands, gaps
FROM (
    SELECT host, gpu, min(s) AS first, max(e) AS last, {span_start} AS span_start_ns, {span_end} AS span_end_ns,
           last - first - sumIf(s - reach, {GAP}) AS busy_ns, countIf({GAP}) + 1 AS islands,
           arrayMap(g -> (g.2, g.3, -g.1),  -- longest first: sorted by negated length
                    groupArraySortedIf({{max_gaps:UInt32}})(
                        (reach - s, reach, s), {GAP} AND s - reach > {{min_gap:Int64}})) AS gaps
    FROM reach GROUP BY host, gpu
)
ORDER BY host, gpu"""
    return sql, {**where.params, "min_gap": min_gap, "max_gaps": max_gaps}


def _ranges(where: Predicates, materialized: bool = False) -> str:
    """CTE `ranges`: NVTX ranges, phases and steps in the window. Materialized (computed
    once, not once per reference) where the query says SETTINGS enable_materialized_cte = 1."""
    return f"""
ranges AS {"MATERIALIZED " if materialized else ""}(
    SELECT id AS range_id, run_id, host, {SCOPE} AS scope, kind, name, pid, tid, depth,
           extras['style'] AS style, {NS}(start) AS rs, {NS}(end) AS re
    FROM {{db}}.events WHERE kind IN {RANGE_KINDS} AND {where.sql()}
)"""


def _levels_join(left: str, time: str, ranges: str = "ranges") -> str:
    """ASOF-join `left` rows to the ranges containing `time`. Ranges in one lane (host,
    thread, kind, style, depth) never overlap, so per lane the latest range starting at or before
    the time is the only candidate; every row is tried against every lane. (A step and the
    phases inside it overlap at depth 0: their kinds keep them in lanes of their own.) The
    lane is joined on its 64-bit hash: one integer key is several times faster than six columns."""
    return f"""
(SELECT *, cityHash64(host, scope, pid, tid, level.1, level.2, level.3) AS lane FROM ({left})
 ARRAY JOIN (SELECT groupUniqArray((kind, style, depth)) FROM {ranges}) AS level) AS w
ASOF INNER JOIN (SELECT *, cityHash64(host, scope, pid, tid, kind, style, depth) AS lane FROM {ranges}) AS r
    ON w.lane = r.lane AND w.{time} >= r.rs"""


def _projection(ranges: str) -> str:
    """CTEs `projected` and `projection`: each range of `ranges` with the GPU work launched
    from inside it (same host, process and thread)."""
    work = f"""
SELECT host, {SCOPE} AS scope, pid, tid, kind, {NS}(launch_start) AS ls, {NS}(start) AS s, {NS}(end) AS e
FROM {{db}}.events
WHERE kind IN {WORK_KINDS} AND launch_start IS NOT NULL AND {COMPLETE}
  AND host IN (SELECT DISTINCT host FROM {ranges})
  AND launch_start >= fromUnixTimestamp64Nano((SELECT min(rs) FROM {ranges}), 'UTC')
  AND launch_start < fromUnixTimestamp64Nano((SELECT max(re) FROM {ranges}), 'UTC')"""
    return f"""
projected AS (
    SELECT r.range_id AS range_id, min(w.s) AS first_start, max(w.e) AS last_end, count() AS ops,
           countIf(w.kind = 'kernel') AS kernel_ops
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


def nvtx_gpu_summary(where: Predicates) -> Query:
    """Per range name: instances, range time, and the projected GPU time of the ranges."""
    # output names never reuse an input column's name: ClickHouse would read the alias instead
    sql = f"""
WITH {_ranges(where, materialized=True)},
{_projection("ranges")}
SELECT name, count() AS instances, countIf(ops > 0) AS with_gpu_work, {capped_sum("re - rs")} AS range_total_ns,
       {capped_sum("projected")} AS gpu_total_ns, avg(projected) AS gpu_avg_ns,
       quantileExactInclusive(0.5)(projected) AS gpu_med_ns, min(projected) AS gpu_min_ns,
       max(projected) AS gpu_max_ns, if(countIf(ops > 0) > 1, stddevSamp(projected), 0) AS gpu_stddev_ns,
       sum(ops) AS gpu_ops, sum(kernel_ops) AS kernels
FROM projection GROUP BY name ORDER BY gpu_total_ns DESC, name
SETTINGS enable_materialized_cte = 1"""
    return sql, where.params


def nvtx_gpu_ranges(where: Predicates, limit: int) -> Query:
    """The first `limit` ranges in start order, each with its projection: only their work is read."""
    sql = f"""
WITH {_ranges(where)},
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
    record on their host (phases of tracehouse.training with no trace beside them): unknown,
    not idle. The range borders
    cut each GPU's time into segments. Busy time before each border comes from one sorted
    pass over the work and the borders together; an instance's busy time is the difference at
    its two borders. Each segment knows the set of names covering
    it (its cover); one ASOF join puts each sample in its segment, so every sample is read
    once whatever the number of names, and counts once per name covering it."""
    metrics = ", ".join(f"'{m}'" for m in PHASE_METRICS.values())
    lo = "fromUnixTimestamp64Nano((SELECT min(rs) FROM ranges), 'UTC')"
    hi = "fromUnixTimestamp64Nano((SELECT max(re) FROM ranges), 'UTC')"
    in_ranges = f"host IN (SELECT DISTINCT host FROM ranges) AND end > {lo} AND start < {hi} AND {COMPLETE}"
    order = "PARTITION BY key ORDER BY t, border, e"
    telemetry = ",\n       ".join(
        f"sumIf(n, metric = '{metric}') AS {name}_n, sumIf(total, metric = '{metric}') AS {name}_sum, "
        f"maxIf(top, metric = '{metric}') AS {name}_max"
        for name, metric in PHASE_METRICS.items()
    )
    results = ", ".join(
        f"if(i.{n}_n > 0, i.{n}_sum / i.{n}_n, NULL) AS {n}_avg, if(i.{n}_n > 0, i.{n}_max, NULL) AS {n}_max"
        for n in PHASE_METRICS
    )
    sql = f"""
WITH {_ranges(where, materialized=True)},
process_gpus AS MATERIALIZED (
    SELECT DISTINCT host, {SCOPE} AS scope, pid, gpu FROM {{db}}.events
    WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND {in_ranges}
),
host_gpus AS MATERIALIZED (
    SELECT DISTINCT host, gpu FROM process_gpus
    UNION DISTINCT
    SELECT DISTINCT host, gpu FROM {{db}}.samples
    WHERE metric IN ({metrics}) AND gpu >= 0 AND host IN (SELECT DISTINCT host FROM ranges) AND ts >= {lo} AND ts < {hi}
),
instances AS MATERIALIZED (  -- each range on each GPU it belongs to; key: the GPU
    SELECT r.range_id AS range_id, cityHash64(g.host, g.gpu) AS key, r.rs AS rs, r.re AS re
    FROM ranges AS r INNER JOIN process_gpus AS g ON g.host = r.host AND g.scope = r.scope AND g.pid = r.pid
    UNION ALL
    SELECT r.range_id, cityHash64(g.host, g.gpu), r.rs, r.re
    FROM ranges AS r INNER JOIN host_gpus AS g ON g.host = r.host
    WHERE (r.host, r.scope, r.pid) NOT IN (SELECT host, scope, pid FROM process_gpus)
),
stream AS (  -- the work's intervals, and the instances' borders as rows of their own (border = 1)
    SELECT cityHash64(host, gpu) AS key, {NS}(start) AS t, {NS}(end) AS e, 0 AS border, 0 AS sign,
           0 AS range_id FROM {{db}}.events
    WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND {in_ranges} AND e > t
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
    SELECT key, n, arraySort(groupUniqArray(name)) AS names, cityHash64(names) AS cover
    FROM (SELECT s.key AS key, r.name AS name, arrayJoin(range(s.first, s.last)) AS n
          FROM spans AS s INNER JOIN ranges AS r USING (range_id))
    GROUP BY key, n
),
segments AS (  -- every border time starts a segment; cover 0: no range covers it
    SELECT b.key AS key, b.t AS s, c.cover AS cover
    FROM (SELECT DISTINCT key, t, n FROM borders) AS b LEFT JOIN covers AS c ON c.key = b.key AND c.n = b.n
),
inside AS (
    SELECT key, cover, metric, count() AS n, sum(value) AS total, max(value) AS top
    FROM (SELECT cityHash64(host, gpu) AS key, metric, {NS}(ts) AS t, value FROM {{db}}.samples
          WHERE metric IN ({metrics}) AND gpu >= 0 AND host IN (SELECT DISTINCT host FROM ranges)
            AND ts >= {lo} AND ts < {hi}) AS w
    ASOF INNER JOIN segments AS g ON g.key = w.key AND w.t >= g.s
    WHERE cover != 0
    GROUP BY key, cover, metric
),
gpus AS (SELECT DISTINCT host, gpu, cityHash64(host, gpu) AS key FROM host_gpus),
named AS (
    SELECT name, key, sum(n) AS samples,
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


# -- compare: runs side by side --------------------------------------------------------------

MAX_COMPARE_RUNS = 1000
DEVICE_METRICS = (GPU_UTIL, GPU_ENERGY, GPU_SM_ACTIVE)  # GPU-level series (pid 0)
PROCESS_METRICS = (PROC_SM_UTIL, PROC_GPU_MEM)  # per-process series (pid of one of the run's processes)
# a run's span is cut into buckets of at least this width to meet its host's samples (an equi-join)
MIN_COMPARE_BUCKET_NS = NS_PER_S
MAX_COMPARE_BUCKETS = 1_000_000  # bucket rows of all the runs together


@dataclass(frozen=True)
class CompareSpan:
    """One run to compare: its host, [start, end) (an open run's end resolved) and the GPU
    indices it declared (attrs `gpus` of a run of source `user`; empty: unknown). Indices past
    DEFAULT_LIMITS.max_gpu_index make the declaration unknown."""

    run_id: str
    host: str
    start: int
    end: int
    gpus: tuple[int, ...] = ()


def compare_runs(run_ids: Sequence[str], tags: Mapping[str, str], limit: int) -> Query:
    """The runs to compare: those named (importing ones too: the caller refuses them), in the
    order named, then those carrying every one of `tags` (newest first), at most `limit`. An
    open run (end NULL) ends at its host's latest sample (+1 ns) or event end since it began:
    `until_ns`."""
    matching = tag_predicates(Predicates(["NOT importing"]), tags) if tags else Predicates(["0"])
    since = "fromUnixTimestamp64Nano((SELECT min(since) FROM open_hosts), 'UTC')"
    order = "wanted = 0, wanted, start_ns DESC, run_id"
    sql = f"""
WITH picked AS (
    SELECT run_id, name, host, source, {NS}(start) AS start_ns, {NS}(end) AS end_ns, relative_time, importing, tags,
           attrs, indexOf({{run_ids:Array(String)}}, run_id) AS wanted
    FROM {{db}}.runs FINAL
    WHERE run_id IN {{run_ids:Array(String)}} OR ({matching.sql()})
    ORDER BY {order} LIMIT {{limit:UInt32}}
),
open_hosts AS (
    SELECT host, min(start_ns) AS since FROM picked WHERE end_ns IS NULL AND NOT relative_time GROUP BY host
),
latest AS (
    SELECT host, max(t) AS latest FROM (
        SELECT host, {NS}(max(ts)) + 1 AS t FROM {{db}}.samples
        WHERE host IN (SELECT host FROM open_hosts) AND ts >= {since} GROUP BY host
        UNION ALL
        SELECT host, {NS}(max(end)) FROM {{db}}.events
        WHERE host IN (SELECT host FROM open_hosts) AND start >= {since} GROUP BY host
    ) GROUP BY host
)
SELECT p.run_id AS run_id, p.name AS name, p.host AS host, p.source AS source, p.start_ns AS start_ns,
       p.end_ns AS end_ns, p.relative_time AS relative_time, p.importing AS importing, p.tags AS tags, p.attrs AS attrs,
       if(p.end_ns IS NULL, if(p.relative_time, p.start_ns, greatest(p.start_ns, l.latest)), p.end_ns) AS until_ns,
       p.wanted AS wanted
FROM picked AS p LEFT JOIN latest AS l ON l.host = p.host
ORDER BY {order}"""
    return sql, {**matching.params, "run_ids": list(run_ids), "limit": limit}


def _compare_width(spans: Sequence[CompareSpan]) -> int:
    """Bucket width for joining samples to the runs they fall in: wide enough that all the
    runs together make at most MAX_COMPARE_BUCKETS buckets."""
    total = sum(max(0, span.end - span.start) for span in spans)
    return max(MIN_COMPARE_BUCKET_NS, -(-total // MAX_COMPARE_BUCKETS))


def _wanted(spans: Sequence[CompareSpan]) -> tuple[str, dict[str, object]]:
    """CTE `wanted(run_id, host, s, e, listed)`: the runs, from bound arrays."""
    cte = """
wanted AS (
    SELECT r.1 AS run_id, r.2 AS host, r.3 AS s, r.4 AS e, r.5 AS listed
    FROM (SELECT arrayJoin(arrayZip({run_ids:Array(String)}, {hosts:Array(String)}, {starts:Array(Int64)},
                                    {ends:Array(Int64)}, {listed:Array(Array(Int16))})) AS r)
)"""
    return cte, {
        "run_ids": [span.run_id for span in spans],
        "hosts": [span.host for span in spans],
        "starts": [span.start for span in spans],
        "ends": [span.end for span in spans],
        "listed": [list(span.gpus) if _gpu_indices(span.gpus) else [] for span in spans],
    }


def _gpu_indices(gpus: Sequence[int]) -> bool:
    """Whether every one of `gpus` is a GPU index (bound as Int16: one past the limit is not)."""
    return all(0 <= gpu <= DEFAULT_LIMITS.max_gpu_index for gpu in gpus)


def _metric_list(metrics: Sequence[str]) -> str:
    return "(" + ", ".join(f"'{metric}'" for metric in metrics) + ")"


def compare_telemetry(spans: Sequence[CompareSpan]) -> Query:
    """Per run (absolute times only): its GPUs (declared; else those its processes have samples
    on; else every GPU of its host with samples), and the telemetry of its host during [start,
    end), whichever run the samples came with: energy (the counter's rises, resets left out, in
    one agent's series per GPU, summed over its GPUs), GPU utilisation (avg, p95 exact with
    linear interpolation, as numpy's default) and GPM SM activity over its GPUs; and its own
    processes' share: per (GPU, instant) the sum over its processes of SM utilisation (averaged)
    and of memory (the peak). A neighbour's process on the same GPU never counts; GPU-level
    figures are the whole GPU's, shared by every run on it at the time.

    Samples meet runs on (host, time bucket): each run is cut into the buckets its span meets,
    so a sample is compared with the few runs of its bucket only, not every run of its host."""
    wanted, params = _wanted(spans)
    width = _compare_width(spans)
    util, energy, sm_active = (f"'{metric}'" for metric in DEVICE_METRICS)
    proc_sm, proc_mem = (f"'{metric}'" for metric in PROCESS_METRICS)
    lo, hi = min(span.start for span in spans), max(span.end for span in spans)
    sql = f"""
WITH {wanted},
spans AS (  -- each run in every bucket its span meets
    SELECT run_id, host, s, e,
           arrayJoin(range(intDiv(s, {{width:Int64}}), intDiv(e - 1, {{width:Int64}}) + 1)) AS bucket
    FROM wanted WHERE e > s
),
pids AS (
    SELECT DISTINCT run_id, pid FROM {{db}}.events
    WHERE kind = 'process' AND host IN {{hosts:Array(String)}} AND run_id IN {{run_ids:Array(String)}} AND pid > 0
),
during AS MATERIALIZED (  -- the host's samples during each run: GPU-level ones, and its own processes'
    SELECT w.run_id AS run_id, x.series AS series, x.gpu AS gpu, x.pid AS pid, x.metric AS metric, x.t AS t,
           x.value AS value
    FROM (SELECT run_id AS series, host, gpu, pid, metric, {NS}(ts) AS t, value, intDiv(t, {{width:Int64}}) AS bucket
          FROM {{db}}.samples
          WHERE host IN {{hosts:Array(String)}} AND ts >= {ns("lo")} AND ts < {ns("hi")} AND gpu >= 0
            AND ((pid = 0 AND metric IN {_metric_list(DEVICE_METRICS)})
                 OR (pid > 0 AND metric IN {_metric_list(PROCESS_METRICS)}))
            AND {COMPLETE}) AS x
    INNER JOIN spans AS w ON w.host = x.host AND w.bucket = x.bucket
    WHERE x.t >= w.s AND x.t < w.e AND (x.pid = 0 OR (w.run_id, x.pid) IN (SELECT run_id, pid FROM pids))
),
own AS MATERIALIZED (  -- per run, GPU and instant: the sums over the run's processes
    SELECT run_id, gpu, t, sumIf(value, metric = {proc_sm}) AS sm, countIf(metric = {proc_sm}) AS sm_n,
           sumIf(value, metric = {proc_mem}) AS mem, countIf(metric = {proc_mem}) AS mem_n
    FROM during WHERE pid > 0 GROUP BY run_id, gpu, t
),
gpus AS MATERIALIZED (
    SELECT w.run_id AS run_id, if(notEmpty(w.listed), w.listed, if(notEmpty(u.used), u.used, d.seen)) AS gpus
    FROM wanted AS w
    LEFT JOIN (SELECT run_id, groupUniqArray(gpu) AS used FROM own GROUP BY run_id) AS u ON u.run_id = w.run_id
    LEFT JOIN (SELECT run_id, groupUniqArray(gpu) AS seen FROM during WHERE pid = 0 GROUP BY run_id) AS d
        ON d.run_id = w.run_id
),
device AS (  -- GPU-level series of the run's GPUs
    SELECT d.run_id AS run_id, d.series AS series, d.gpu AS gpu, d.metric AS metric, d.t AS t, d.value AS value
    FROM during AS d INNER JOIN gpus AS g ON g.run_id = d.run_id WHERE d.pid = 0 AND has(g.gpus, d.gpu)
),
device_figures AS (
    SELECT run_id, countIf(metric = {util}) AS util_n, avgIf(value, metric = {util}) AS util_avg,
           quantileExactInclusiveIf(0.95)(value, metric = {util}) AS util_p95,
           countIf(metric = {sm_active}) AS sm_active_n, avgIf(value, metric = {sm_active}) AS sm_active_avg
    FROM device GROUP BY run_id
),
energy AS (  -- per series (the agent that sampled it) and GPU, the counter's rises in time order: a step
    -- down is a reset (a driver reload) and adds nothing. Per GPU the series with the most readings counts
    -- (two agents' views of one GPU, each from its own origin, are never mixed nor added); summed over GPUs
    SELECT run_id, sum(rise) AS energy FROM (
        SELECT run_id, gpu, argMax(rise, (n, series)) AS rise FROM (
            SELECT run_id, gpu, series, count() AS n, sum(greatest(step, 0)) AS rise FROM (
                SELECT run_id, gpu, series,
                       value - lagInFrame(value, 1, value) OVER (
                           PARTITION BY run_id, gpu, series ORDER BY t, value ROWS BETWEEN 1 PRECEDING AND CURRENT ROW
                       ) AS step
                FROM device WHERE metric = {energy}
            ) GROUP BY run_id, gpu, series
        ) GROUP BY run_id, gpu
    ) GROUP BY run_id
),
own_figures AS (
    SELECT run_id, countIf(sm_n > 0) AS sm_points, avgIf(sm, sm_n > 0) AS sm_avg,
           countIf(mem_n > 0) AS mem_points, maxIf(mem, mem_n > 0) AS mem_peak
    FROM own GROUP BY run_id
)
SELECT w.run_id AS run_id, arrayStringConcat(arrayMap(x -> toString(x), arraySort(g.gpus)), ',') AS gpus,
       if(e.run_id != '', e.energy, NULL) AS energy_j,
       if(f.util_n > 0, f.util_avg, NULL) AS gpu_util_mean, if(f.util_n > 0, f.util_p95, NULL) AS gpu_util_p95,
       if(f.sm_active_n > 0, f.sm_active_avg, NULL) AS sm_active_mean,
       if(o.sm_points > 0, o.sm_avg, NULL) AS proc_sm_util_mean,
       if(o.mem_points > 0, toInt64(round(o.mem_peak)), NULL) AS gpu_mem_peak_bytes
FROM wanted AS w
LEFT JOIN gpus AS g ON g.run_id = w.run_id
LEFT JOIN device_figures AS f ON f.run_id = w.run_id
LEFT JOIN energy AS e ON e.run_id = w.run_id
LEFT JOIN own_figures AS o ON o.run_id = w.run_id
SETTINGS enable_materialized_cte = 1"""
    return sql, {**params, "width": width, "lo": lo, "hi": hi}


def compare_traced(spans: Sequence[CompareSpan], top: int) -> Query:
    """Per run with GPU work (kernels, memory operations) of its own: busy % (the union of
    the work's intervals per GPU, clipped to the run, over the run's duration times its GPUs
    with work), kernels, and the `top` kernel names by total time with their share of it."""
    wanted, params = _wanted(spans)
    mine = "host IN {hosts:Array(String)} AND run_id IN {run_ids:Array(String)}"
    work = f"""
SELECT w.run_id AS run_id, x.host AS host, x.gpu AS gpu, greatest(x.s, w.s) AS s, least(x.e, w.e) AS e
FROM (SELECT run_id, host, gpu, {NS}(start) AS s, {NS}(end) AS e FROM {{db}}.events
      WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND {mine}) AS x
INNER JOIN wanted AS w ON w.run_id = x.run_id"""
    keys = "run_id, host, gpu"
    sql = f"""
WITH {wanted},
{_reach(work, keys)},
busy AS (
    SELECT run_id, {capped_sum("busy_ns")} AS busy_ns, count() AS work_gpus
    FROM (SELECT {keys}, max(e) - min(s) - sumIf(s - reach, {GAP}) AS busy_ns FROM reach GROUP BY {keys})
    GROUP BY run_id
),
kernel_names AS (
    SELECT run_id, name, count() AS n, {capped_sum(f"{NS}(end) - {NS}(start)")} AS total
    FROM {{db}}.events
    WHERE kind = 'kernel' AND {mine} GROUP BY run_id, name
),
kernel_runs AS (
    SELECT run_id, sum(n) AS instances, {capped_sum("total")} AS kernel_ns,
           groupArraySorted({{top:UInt32}})((-total, name)) AS longest  -- longest first: sorted by negated total
    FROM kernel_names GROUP BY run_id
)
SELECT w.run_id AS run_id,
       if(b.work_gpus > 0 AND w.e > w.s, 100 * toFloat64(b.busy_ns) / ((w.e - w.s) * b.work_gpus), NULL) AS busy_pct,
       k.instances AS kernels,
       if(k.instances > 0,
          arrayStringConcat(arrayMap(x -> printf('%s (%.1f%%)', substringUTF8(x.2, 1, 80),
                                                 if(k.kernel_ns > 0, -100 * x.1 / k.kernel_ns, 0)), k.longest), '; '),
          NULL) AS top_kernels
FROM wanted AS w
LEFT JOIN busy AS b ON b.run_id = w.run_id
LEFT JOIN kernel_runs AS k ON k.run_id = w.run_id"""
    return sql, {**params, "top": top}
