"""The SQL of the analyses over one timeline. Pure: text and bound parameters.

Every analysis runs inside the store as set-based SQL: a running maximum of GPU work's end
times finds its idle gaps, ASOF joins tie GPU work to the NVTX ranges it was launched from
and samples to the ranges they fall in, running sums give busy time inside any interval.
Times in results are ns since the epoch (Int64).

Here: GPU time, launch latency, short kernels, idle after sync, diff and a range's instance.
NVTX→GPU projection and phases are in query/projection.py, compare in query/compare.py;
their names are importable from here too.
"""

from __future__ import annotations

from query.compare import MAX_COMPARE_RUNS, CompareSpan, compare_runs, compare_telemetry, compare_traced
from query.gpuwork import GAP, NS, RANGE_KINDS, WORK_KINDS, Query, reach
from query.kept import KEEP_SETTINGS, keep_token, of_kept
from query.projection import PHASE_METRICS, keep_ranges, kept_in_window, nvtx_gpu_ranges, nvtx_gpu_summary, phases
from query.window import Predicates
from tracehouse.model import SUM_CAP_NS

__all__ = [
    "DIFF_CATEGORIES",
    "MAX_COMPARE_RUNS",
    "NS",
    "PHASE_METRICS",
    "RANGE_KINDS",
    "WORK_KINDS",
    "CompareSpan",
    "Query",
    "compare_runs",
    "compare_telemetry",
    "compare_traced",
    "diff",
    "gpu_time",
    "idle_after_sync",
    "keep_gaps",
    "keep_gpus",
    "keep_islands",
    "keep_ranges",
    "kept_in_window",
    "kept_span",
    "launch_latency",
    "nvtx_gpu_ranges",
    "nvtx_gpu_summary",
    "phases",
    "range_instance",
    "short_kernels",
]


def _clipped(where: Predicates, start: str, end: str, clip_from: int | None, clip_to: int | None) -> tuple[str, str]:
    """`start` and `end` (SQL, ns) clipped to the window's bounds, which `where` binds."""
    if clip_from is not None:
        where.params["clip_from"] = clip_from
        start = f"greatest({start}, {{clip_from:Int64}})"
    if clip_to is not None:
        where.params["clip_to"] = clip_to
        end = f"least({end}, {{clip_to:Int64}})"
    return start, end


def _work(where: Predicates, clip_from: int | None, clip_to: int | None) -> str:
    """GPU work (kernels and memory operations) in the window, clipped to it."""
    start, end = _clipped(where, f"{NS}(start)", f"{NS}(end)", clip_from, clip_to)
    return f"""
SELECT host, gpu, {start} AS s, {end} AS e FROM {{db}}.events
WHERE kind IN {WORK_KINDS} AND gpu >= 0 AND {where.sql()}"""


def _gaps(where: Predicates, clip_from: int | None, clip_to: int | None) -> str:
    """CTE text: `gaps(host, gpu, start_ns, end_ns, length_ns)`, the idle time between islands."""
    return f"""{reach(_work(where, clip_from, clip_to))},
gaps AS (SELECT host, gpu, reach AS start_ns, s AS end_ns, s - reach AS length_ns FROM reach WHERE {GAP})"""


# a gap as one Int128 that sorts longest first, then earliest: its negated length in the high 64 bits, its
# start (reach) in the low ones; several times cheaper to keep the longest of than a tuple
_GAP_KEY = "bitShiftLeft(toInt128(reach - s), 64) + reach"
_LONG_GAP = f"{GAP} AND s - reach > {{min_gap:Int64}}"


def gpu_time(
    where: Predicates, clip_from: int | None, clip_to: int | None, min_gap: int, max_gaps: int,
    kept: tuple[str, int] | None = None, whole: bool = False,
) -> Query:  # fmt: skip
    """Per GPU: span, busy, idle, busy %, islands, how many gaps there are over `min_gap` and
    the `max_gaps` longest of them as an array; one pass over the work. Busy time is the union's extent
    less its gaps. Of a run `kept` (run id, fingerprint: query/kept.py): one pass over its kept islands in
    the window, or, `whole` (the window holds every island: `kept_span`), a row per GPU and the gaps asked
    for."""
    params: dict[str, object] = {"min_gap": min_gap, "max_gaps": max_gaps, "clip_from": clip_from, "clip_to": clip_to}
    if kept is None:
        per_gpu = _per_gpu_of_reach(reach(_work(where, clip_from, clip_to)))
    else:
        kept_rows, kept_params = of_kept([kept])
        where.params.update(kept_params)
        per_gpu = (
            _whole_gpus(where, kept_rows) if whole
            else _per_gpu_of_reach(_kept_reach(where, clip_from, clip_to, kept_rows))
        )  # fmt: skip
    span_start = "{clip_from:Int64}" if clip_from is not None else "first"
    span_end = "{clip_to:Int64}" if clip_to is not None else "last"
    sql = f"""
SELECT host, gpu, {span_start} AS span_start_ns, {span_end} AS span_end_ns, busy_ns,
       span_end_ns - span_start_ns - busy_ns AS idle_ns, 100 * busy_ns / (span_end_ns - span_start_ns) AS busy_pct,
       islands, long_gaps, gaps
FROM ({per_gpu})
ORDER BY host, gpu"""
    if kept is not None and whole:  # kept_gaps are sorted by GPU: counted in that order, several times faster
        sql += "\nSETTINGS optimize_aggregation_in_order = 1"
    return sql, {**where.params, **{k: v for k, v in params.items() if v is not None}}


def _per_gpu_of_reach(ctes: str) -> str:
    """gpu_time's rows before its span (first, last, busy_ns, islands, long_gaps, gaps per GPU) of `ctes`, whose
    `reach` has the work (or islands) with the running reach of the ends before each."""
    return f"""
WITH {ctes}
SELECT host, gpu, min(s) AS first, max(e) AS last, last - first - sumIf(s - reach, {GAP}) AS busy_ns,
       countIf({GAP}) + 1 AS islands, countIf({_LONG_GAP}) AS long_gaps,
       arrayMap(k -> (toInt64(bitAnd(k, 0xFFFFFFFFFFFFFFFF)) AS at, at - toInt64(bitShiftRight(k, 64)),
                      -toInt64(bitShiftRight(k, 64))),
                groupArraySortedIf({{max_gaps:UInt32}})({_GAP_KEY}, {_LONG_GAP})) AS gaps
FROM reach GROUP BY host, gpu"""


def _whole_gpus(where: Predicates, kept_rows: str) -> str:
    """gpu_time's rows before its span, of a kept run whose every island is in the window: a row per GPU as
    kept, its gaps over min_gap counted and the longest read by their rank."""
    gaps = f"FROM {{db}}.kept_gaps WHERE {kept_rows} AND length > {{min_gap:Int64}}"
    return f"""
SELECT host, gpu, {NS}(start) AS first, {NS}(end) AS last, busy AS busy_ns, islands, long_gaps, gaps
FROM (SELECT * FROM {{db}}.kept_gpus WHERE {kept_rows} AND {where.sql()}) AS g
LEFT JOIN (SELECT host, gpu, count() AS long_gaps {gaps} GROUP BY host, gpu) AS n USING (host, gpu)
LEFT JOIN (SELECT host, gpu,
                  arrayMap(r -> r.2, arraySort(groupArray((rank, ({NS}(start), {NS}(start) + length, length))))) AS gaps
           {gaps} AND rank <= {{max_gaps:UInt32}} GROUP BY host, gpu) AS l USING (host, gpu)"""


def _kept_reach(where: Predicates, clip_from: int | None, clip_to: int | None, kept_rows: str) -> str:
    """CTE `reach` as `reach(_work(...))` has it, from the kept islands: each island in the window, clipped
    to it, with the end of the island before it where that one is in the window too (else 0), which is
    what the running reach of the work is at the island's first interval."""
    start, end = _clipped(where, "s0", "s0 + length", clip_from, clip_to)
    before = "gap > 0" if clip_from is None else "gap > 0 AND s0 - gap > {clip_from:Int64}"
    return f"""
reach AS (
    SELECT host, gpu, {start} AS s, {end} AS e, if({before}, s0 - gap, 0) AS reach
    FROM (SELECT host, gpu, {NS}(start) AS s0, length, gap FROM {{db}}.kept_islands
          WHERE {kept_rows} AND {where.sql()})
    WHERE e > s
)"""


def kept_span(kept: tuple[str, int]) -> Query:
    """(first, last): where the islands of a `kept` run (run id, fingerprint) start and end; a window that
    holds both holds them all (gpu_time's `whole`)."""
    kept_rows, params = of_kept([kept])
    sql = f"SELECT min({NS}(start)) AS first, max({NS}(end)) AS last FROM {{db}}.kept_gpus WHERE {kept_rows}"
    return sql, params


def keep_islands(run_id: str, generation: int) -> Query:
    """INSERT of a run's GPU work merged into busy islands per GPU into `kept_islands` (query/kept.py), each
    with the gap before it: an island starts where the work's running reach leaves one."""
    where = Predicates()
    where.add("run_id = {run_id:String}", run_id=run_id)
    sql = f"""
INSERT INTO {{db}}.kept_islands (run_id, host, gpu, start, length, gap, generation)
WITH {reach(_work(where, None, None))}
SELECT {{run_id:String}}, host, gpu, fromUnixTimestamp64Nano(min(s), 'UTC'), max(e) - min(s),
       if(min(reach) = 0, 0, min(s) - min(reach)), {{generation:UInt64}}
FROM (SELECT host, gpu, s, e, reach,
             sum(reach = 0 OR {GAP}) OVER (PARTITION BY host, gpu ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island
      FROM reach)
GROUP BY host, gpu, island ORDER BY host, gpu, island
SETTINGS {KEEP_SETTINGS}"""
    return sql, {**where.params, "generation": generation, "token": keep_token("kept_islands", run_id, generation)}


def keep_gpus(run_id: str, generation: int) -> Query:
    """INSERT of a run's kept islands (of fingerprint `generation`) summed up per GPU into `kept_gpus`."""
    sql = f"""
INSERT INTO {{db}}.kept_gpus (run_id, host, gpu, start, end, busy, islands, generation)
SELECT {{run_id:String}}, host, gpu, min(start), max(end), sum(length), count(), {{generation:UInt64}}
FROM {{db}}.kept_islands WHERE run_id = {{run_id:String}} AND generation = {{generation:UInt64}}
GROUP BY host, gpu ORDER BY host, gpu
SETTINGS {KEEP_SETTINGS}"""
    return sql, {"run_id": run_id, "generation": generation, "token": keep_token("kept_gpus", run_id, generation)}


def keep_gaps(run_id: str, generation: int) -> Query:
    """INSERT of the gaps between a run's kept islands (of fingerprint `generation`) into `kept_gaps`, each
    GPU's ranked longest first, then earliest (as gpu_time's longest gaps are)."""
    sql = f"""
INSERT INTO {{db}}.kept_gaps (run_id, host, gpu, rank, start, length, generation)
SELECT {{run_id:String}}, host, gpu, row_number() OVER (PARTITION BY host, gpu ORDER BY gap DESC, start) AS rank,
       fromUnixTimestamp64Nano({NS}(start) - gap, 'UTC'), gap, {{generation:UInt64}}
FROM {{db}}.kept_islands WHERE run_id = {{run_id:String}} AND generation = {{generation:UInt64}} AND gap > 0
ORDER BY host, gpu, rank
SETTINGS {KEEP_SETTINGS}"""
    return sql, {"run_id": run_id, "generation": generation, "token": keep_token("kept_gaps", run_id, generation)}


def launch_latency(where: Predicates) -> Query:
    sql = f"""
SELECT name, count() AS kernels, avg(toFloat64(l)) AS avg_ns,
       quantileExactInclusive(0.5)(l) AS med_ns, quantileExactInclusive(0.9)(l) AS p90_ns,
       quantileExactInclusive(0.99)(l) AS p99_ns, min(l) AS min_ns, max(l) AS max_ns
FROM (SELECT name, {NS}(start) - {NS}(launch_start) AS l FROM {{db}}.events
      WHERE kind = 'kernel' AND launch_start IS NOT NULL AND {where.sql()})
GROUP BY name ORDER BY kernels DESC, name"""
    return sql, where.params


def short_kernels(where: Predicates, short_ns: int) -> Query:
    sql = f"""
SELECT name, countIf(d < {{short:Int64}}) AS short, count() AS kernels, 100 * short / kernels AS short_pct,
       toInt64(least(sumIf(toInt128(d), d < {{short:Int64}}), {SUM_CAP_NS})) AS short_total_ns
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
    """Per category and name, each run's instances, total and average, and B - A. Sums are taken in
    Int128 and answered in Int64 as query/sql.py's capped_sum answers them: a total or change past
    2**63 - 1 ns (292 years) is answered at the cap, and `saturated` says so; delta_pct is the exact
    sums' change."""
    kinds = ", ".join(DIFF_CATEGORIES[s] for s in summaries)
    side = {"a": "{run_a:String}", "b": "{run_b:String}"}
    columns = ",\n       ".join(
        f"countIf(run_id = {run}) AS instances_{k}, sumIf(toInt128(d), run_id = {run}) AS sum_{k}, "
        f"toInt64(least(sum_{k}, {SUM_CAP_NS})) AS total_ns_{k}, "
        f"if(instances_{k} > 0, avgIf(toFloat64(d), run_id = {run}), NULL) AS avg_ns_{k}"
        for k, run in side.items()
    )
    sql = f"""
SELECT category, name, instances_a, total_ns_a, avg_ns_a, instances_b, total_ns_b, avg_ns_b, delta_ns, delta_pct,
       toBool(greatest(sum_a, sum_b, abs(sum_b - sum_a)) > {SUM_CAP_NS}) AS saturated
FROM (
SELECT category, name,
       {columns},
       toInt64(greatest(least(sum_b - sum_a, {SUM_CAP_NS}), -{SUM_CAP_NS})) AS delta_ns,
       if(sum_a > 0, 100 * (toFloat64(sum_b) - toFloat64(sum_a)) / toFloat64(sum_a), NULL) AS delta_pct
FROM (
    SELECT multiIf(kind = 'kernel', 'kernels', kind = 'cuda_api', 'api', 'memops') AS category, name, run_id,
           {NS}(end) - {NS}(start) AS d
    FROM {{db}}.events WHERE run_id IN ({{run_a:String}}, {{run_b:String}}) AND kind IN ({kinds})
)
GROUP BY category, name
)
ORDER BY abs(delta_ns) DESC, category, name
{"LIMIT {limit:UInt32}" if limit else ""}"""
    return sql, {"run_a": run_a, "run_b": run_b, "limit": limit}


def range_instance(where: Predicates, name: str, instance: int) -> Query:
    """The `instance`-th range named `name`; Kineto's ProfilerStep#N is stored as a step named `step`
    with N in its extras, and found under the name it had in the trace."""
    sql = f"""
SELECT {NS}(start) AS s, {NS}(end) AS e, count() OVER () AS instances FROM {{db}}.events
WHERE kind IN {RANGE_KINDS} AND {where.sql()} AND (name = {{range_name:String}}
    OR kind = 'step' AND name = 'step' AND concat('ProfilerStep#', extras['step']) = {{range_name:String}})
ORDER BY start, id LIMIT 1 OFFSET {{offset:UInt64}}"""
    return sql, {**where.params, "range_name": name, "offset": instance - 1}
