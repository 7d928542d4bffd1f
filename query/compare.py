"""The SQL of compare: runs side by side, each with the telemetry of its GPUs and its own
processes during it, and the busy time and top kernels of its own GPU work. Pure: text and
bound parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from query.gpuwork import GAP, NS, WORK_KINDS, Query, reach
from query.sql import capped_sum, tag_predicates
from query.window import COMPLETE, Predicates, ns
from tracehouse.metrics import GPU_ENERGY, GPU_SM_ACTIVE, GPU_UTIL, PROC_GPU_MEM, PROC_SM_UTIL
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.timefmt import NS_PER_S

MAX_COMPARE_RUNS = 1000
DEVICE_METRICS = (GPU_UTIL, GPU_ENERGY, GPU_SM_ACTIVE)  # GPU-level series (pid 0)
PROCESS_METRICS = (PROC_SM_UTIL, PROC_GPU_MEM)  # per-process series (pid of one of the run's processes)
# a run's span is cut into buckets of at least this width to meet its host's samples (an equi-join)
MIN_COMPARE_BUCKET_NS = NS_PER_S
MAX_COMPARE_BUCKETS = 1_000_000  # bucket rows of all the runs together
TOP_NAME_CHARS = 4096  # a top kernel's name is read whole up to this (real templated names pass 1 KiB)


@dataclass(frozen=True)
class CompareSpan:
    """One run to compare: its host, [start, end) (an open run's end resolved) and its GPU
    indices when known (query/rungpus.py; empty: unknown). Indices past
    DEFAULT_LIMITS.max_gpu_index make them unknown."""

    run_id: str
    host: str
    start: int
    end: int
    gpus: tuple[int, ...] = ()


def compare_runs(run_ids: Sequence[str], tags: Mapping[str, str], limit: int) -> Query:
    """The runs to compare: those named (importing ones too: the caller refuses them), in the
    order named, then those carrying every one of `tags` (newest first), at most `limit`. An
    open run (end NULL) ends at its host's latest sample (+1 ns) or event end since it began:
    `until_ns`; `registered`: the GPU indices of the devices registered under the run."""
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
),
registered AS (  -- the devices registered under each run (an import's trace GPUs, an agent's sampled ones)
    SELECT run_id, arraySort(groupUniqArray(gpu)) AS gpus FROM {{db}}.devices FINAL
    WHERE run_id IN (SELECT run_id FROM picked) AND gpu >= 0 GROUP BY run_id
)
SELECT p.run_id AS run_id, p.name AS name, p.host AS host, p.source AS source, p.start_ns AS start_ns,
       p.end_ns AS end_ns, p.relative_time AS relative_time, p.importing AS importing, p.tags AS tags, p.attrs AS attrs,
       if(p.end_ns IS NULL, if(p.relative_time, p.start_ns, greatest(p.start_ns, l.latest)), p.end_ns) AS until_ns,
       p.wanted AS wanted, d.gpus AS registered
FROM picked AS p LEFT JOIN latest AS l ON l.host = p.host LEFT JOIN registered AS d ON d.run_id = p.run_id
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
    """Per run (absolute times only): its GPUs (those of its span when known, see
    query/rungpus.py; else those its processes have samples on; else every GPU of its host with
    samples), and the telemetry of its host during [start,
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
SELECT w.run_id AS run_id, arraySort(g.gpus) AS gpus,
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
    """Per run with GPU work (kernels, memory operations) of its own: the GPUs it ran on
    (`worked`), busy % (the union of the work's intervals per GPU, clipped to the run, over the
    run's duration times its GPUs with work), kernels, and the `top` kernel names by total time
    (`top_names`, whole up to TOP_NAME_CHARS) with their share of it in % (`top_shares`)."""
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
{reach(work, keys)},
busy AS (
    SELECT run_id, {capped_sum("busy_ns")} AS busy_ns, count() AS work_gpus, arraySort(groupUniqArray(gpu)) AS gpus
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
SELECT w.run_id AS run_id, b.gpus AS worked,
       if(b.work_gpus > 0 AND w.e > w.s, 100 * toFloat64(b.busy_ns) / ((w.e - w.s) * b.work_gpus), NULL) AS busy_pct,
       k.instances AS kernels,
       if(k.instances > 0, arrayMap(x -> substringUTF8(x.2, 1, {TOP_NAME_CHARS}), k.longest), []) AS top_names,
       if(k.instances > 0, arrayMap(x -> if(k.kernel_ns > 0, -100 * x.1 / k.kernel_ns, 0), k.longest), []) AS top_shares
FROM wanted AS w
LEFT JOIN busy AS b ON b.run_id = w.run_id
LEFT JOIN kernel_runs AS k ON k.run_id = w.run_id"""
    return sql, {**params, "top": top}
