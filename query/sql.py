"""The SQL behind each question. Pure: text and bound parameters, no I/O."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from query import answerbytes
from query.window import Predicates, ns
from tracehouse.model import ROLLUP_SECONDS, SUM_CAP_NS
from tracehouse.requesterrors import QueryError
from tracehouse.timefmt import NS_PER_S

MAX_SERIES_SPAN_NS = 100 * 365 * 86_400 * NS_PER_S
_SECOND_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _round_widths(at_least: int) -> Iterator[int]:
    """Round widths from at_least up: 1-2-5 below a second; 1, 2, 5, 10, 15, 30 s, 1, 2,
    5, 10, 15, 30 min, 1, 2, 3, 6, 12 h; then whole days."""
    if at_least < NS_PER_S:
        exponent = 10 ** (len(str(at_least)) - 1)
        while exponent < NS_PER_S:
            for step in (1, 2, 5):
                if step * exponent >= at_least:
                    yield step * exponent
            exponent *= 10
    for seconds in _SECOND_STEPS:
        if seconds * NS_PER_S >= at_least:
            yield seconds * NS_PER_S
    day = 86400 * NS_PER_S
    days = max(1, math.ceil(at_least / day))
    while True:
        yield days * day
        days += 1


def aligned_buckets(start: int, end: int, width: int) -> int:
    """How many buckets aligned to multiples of width meet [start, end)."""
    return (end - 1) // width - start // width + 1


def bucket_width(start: int, end: int, max_points: int) -> int:
    """The smallest round width whose aligned buckets over [start, end) number at most max_points."""
    at_least = max(1, math.ceil((end - start) / max_points))
    for width in _round_widths(at_least):
        if aligned_buckets(start, end, width) <= max_points:
            return width
    raise AssertionError("unreachable: widths grow without bound")


@dataclass(frozen=True)
class Rollup:
    """A rollup table of samples whose whole rows cover [from_ns, to_ns)."""

    table: str
    from_ns: int
    to_ns: int


# rollups of `samples`, coarsest first, by the span one row sums up
ROLLUPS = tuple(
    (table, seconds * NS_PER_S) for table, seconds in sorted(ROLLUP_SECONDS.items(), key=lambda item: -item[1])
)
COARSEST_ROLLUP = ROLLUPS[0]


def rollup_for(start: int, end: int, width: int) -> Rollup | None:
    """The coarsest rollup whose rows each fall in one bucket of `width`, over the whole
    rollup rows inside [start, end); None when no rollup helps."""
    for table, span in ROLLUPS:
        first, last = -(-start // span) * span, end // span * span
        if width % span == 0 and first < last:
            return Rollup(table, first, last)
    return None


_BUCKET = "{origin:Int64} + intDiv(toUnixTimestamp64Nano(ts) - {origin:Int64}, {width:Int64}) * {width:Int64}"


def series_span(selects: Predicates, start: int | None, end: int | None) -> tuple[str, dict[str, object]]:
    """Where the data of an open window lies, to the minute, from the coarsest rollup:
    first and last row start and the number of samples. `selects` has no time predicates."""
    table, span = COARSEST_ROLLUP
    where = Predicates(list(selects.clauses), dict(selects.params))
    if start is not None:
        where.add(f"ts >= {ns('span_from')}", span_from=start - start % span)
    if end is not None:
        where.add(f"ts < {ns('span_to')}", span_to=end)
    sql = (
        "SELECT toUnixTimestamp64Nano(min(ts)), toUnixTimestamp64Nano(max(ts)), sum(count) "
        f"FROM {{db}}.{table} WHERE metric IN {{metrics:Array(String)}} AND {where.sql()}"
    )
    return sql, where.params


def series_ends(where: Predicates, first_row: int, last_row: int) -> tuple[str, dict[str, object]]:
    """The first and last sample, found inside the first and last rows of the coarsest rollup."""
    span = COARSEST_ROLLUP[1]
    sql = f"""
SELECT toUnixTimestamp64Nano(minIf(toNullable(ts), ts < {ns("first_row_end")})),
       toUnixTimestamp64Nano(maxIf(toNullable(ts), ts >= {ns("last_row")}))
FROM {{db}}.samples
WHERE metric IN {{metrics:Array(String)}} AND {where.sql()}
  AND ((ts >= {ns("first_row")} AND ts < {ns("first_row_end")})
       OR (ts >= {ns("last_row")} AND ts < {ns("last_row_end")}))
"""
    return sql, {
        **where.params,
        "first_row": first_row,
        "first_row_end": first_row + span,
        "last_row": last_row,
        "last_row_end": last_row + span,
    }


def series(
    where: Predicates, origin: int, width: int, rollup: Rollup | None = None, selects: Predicates | None = None
) -> tuple[str, dict[str, object]]:
    """min/avg/max/count per bucket. With a rollup, its rows cover the middle of the window
    (`selects`: the window's predicates without times) and raw samples only its edges."""
    keys = "host, gpu, pid, metric"
    if rollup is None or selects is None:
        sql = f"""
SELECT {keys}, {_BUCKET} AS bucket_start,
       min(value) AS min, avg(value) AS avg, max(value) AS max, count() AS count
FROM {{db}}.samples
WHERE metric IN {{metrics:Array(String)}} AND {where.sql()}
GROUP BY {keys}, bucket_start
ORDER BY {keys}, bucket_start
"""
        return sql, {**where.params, "origin": origin, "width": width}
    middle = f"ts >= {ns('rollup_from')} AND ts < {ns('rollup_to')}"
    sql = f"""
SELECT {keys}, bucket_start,
       min(lo) AS min, sum(total) / sum(n) AS avg, max(hi) AS max, sum(n) AS count
FROM (
    SELECT {keys}, {_BUCKET} AS bucket_start, min AS lo, max AS hi, sum AS total, count AS n
    FROM {{db}}.{rollup.table}
    WHERE metric IN {{metrics:Array(String)}} AND {selects.sql()} AND {middle}
    UNION ALL
    SELECT {keys}, {_BUCKET} AS bucket_start, value AS lo, value AS hi, value AS total, toUInt64(1) AS n
    FROM {{db}}.samples
    WHERE metric IN {{metrics:Array(String)}} AND {where.sql()} AND NOT ({middle})
)
GROUP BY {keys}, bucket_start
ORDER BY {keys}, bucket_start
"""
    return sql, {
        **selects.params,
        **where.params,
        "origin": origin,
        "width": width,
        "rollup_from": rollup.from_ns,
        "rollup_to": rollup.to_ns,
    }


def metrics(where: Predicates, limit: int) -> tuple[str, dict[str, object]]:
    sql = f"""
SELECT host, gpu, pid, metric, count() AS samples,
       toUnixTimestamp64Nano(min(ts)) AS first_ns, toUnixTimestamp64Nano(max(ts)) AS last_ns
FROM {{db}}.samples WHERE {where.sql()}
GROUP BY host, gpu, pid, metric ORDER BY host, gpu, pid, metric LIMIT {{limit:UInt32}}
"""
    return sql, {**where.params, "limit": limit}


# Aliases never reuse a column's name: ClickHouse would substitute them into WHERE.
EVENT_COLUMNS = (
    "run_id, host, kind, toUnixTimestamp64Nano(start) AS start_ns, toUnixTimestamp64Nano(end) AS end_ns, "
    "gpu, stream, pid, tid, name, correlation_id, bytes, depth, extras, id, "
    "ifNull(toUnixTimestamp64Nano(launch_start), -1) AS launch_start_ns"
)


def events(
    where: Predicates, page_size: int, after: tuple[int, int] | None, through: tuple[int, int] | None = None
) -> tuple[str, dict[str, object]]:
    """A page: at most page_size + 1 events (one more says there are more) after `after` (start, id),
    up to `through` (start, id) inclusive."""
    params: dict[str, object] = {**where.params, "limit": page_size + 1}
    clauses = where.sql()
    if after is not None:
        clauses += f" AND (start, id) > ({ns('after_start')}, {{after_id:UInt64}})"
        params.update(after_start=after[0], after_id=after[1])
    if through is not None:
        clauses += f" AND (start, id) <= ({ns('through_start')}, {{through_id:UInt64}})"
        params.update(through_start=through[0], through_id=through[1])
    sql = f"SELECT {EVENT_COLUMNS} FROM {{db}}.events WHERE {clauses} ORDER BY start, id LIMIT {{limit:UInt32}}"
    return sql, params


def event_sizes(where: Predicates, page_size: int, after: tuple[int, int] | None) -> tuple[str, dict[str, object]]:
    """The (start_ns, id, row_bytes) of the events a page of `events` holds: found by (start, id) alone, then
    measured (only those, and no string sorted)."""
    text, params = events(where, page_size, after)
    page = text.replace(f"SELECT {EVENT_COLUMNS} ", "SELECT (start, id) ", 1)
    sql = f"""
SELECT start_ns, id, row_bytes FROM (
    SELECT toUnixTimestamp64Nano(start) AS start_ns, id, {answerbytes.event_bytes()} AS row_bytes FROM {{db}}.events
    WHERE {where.sql()} AND (start, id) IN ({page})
) ORDER BY start_ns, id"""
    return sql, params


def page_token(start: int, event_id: int) -> str:
    return base64.urlsafe_b64encode(f"{start}:{event_id}".encode()).decode()


def parse_page_token(token: str) -> tuple[int, int] | None:
    if not token:
        return None
    try:
        start, event_id = (int(part) for part in base64.urlsafe_b64decode(token.encode()).decode().split(":"))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise QueryError("page_token", "not a token this server gave out") from None
    if not (0 <= start < 2**63 and 0 <= event_id < 2**64):
        raise QueryError("page_token", "not a token this server gave out")
    return start, event_id


def capped_sum(expression: str) -> str:
    """A sum of Int64 durations that cannot wrap: taken in Int128, answered in Int64, at most 2**63 - 1."""
    return f"toInt64(least(sum(toInt128({expression})), {SUM_CAP_NS}))"


@dataclass(frozen=True)
class SummaryKind:
    kinds: tuple[str, ...]  # event kinds it covers
    measure: str  # what it sums per event
    unit: str  # suffix of the measure's columns
    styled: bool = False  # grouped by name and style (push/pop or start/end), as nsys's nvtx_sum


# nsys stats reports: cuda_gpu_kern_sum, cuda_api_sum, cuda_gpu_mem_time_sum, nvtx_sum,
# cuda_gpu_mem_size_sum
SUMMARIES: dict[str, SummaryKind] = {
    "kernels": SummaryKind(("kernel",), "toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)", "ns"),
    "api": SummaryKind(("cuda_api",), "toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)", "ns"),
    "memops": SummaryKind(("memcpy", "memset"), "toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)", "ns"),
    # NVTX ranges, and the phases and steps that agent.training records
    "nvtx": SummaryKind(
        ("nvtx", "phase", "step"), "toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)", "ns", styled=True
    ),
    "memsize": SummaryKind(("memcpy", "memset"), "toInt64(bytes)", "bytes"),
}


def summary(where: Predicates, kind: str, limit: int) -> tuple[str, dict[str, object]]:
    """nsys-stats style, per name (and style, for ranges): instances, total, avg, median (the mean
    of the two middle values for an even count), min, max, sample standard deviation (0 for one
    instance), and the group's share of the total. An event overlapping the window counts whole. Sums
    are taken in Int128 and answered in Int64, at most 2**63 - 1 (292 years); averages in Float64."""
    if kind not in SUMMARIES:
        raise QueryError("kind", f"{kind!r} is not one of {', '.join(SUMMARIES)}")
    spec = SUMMARIES[kind]
    u = spec.unit
    style = ", style" if spec.styled else ""
    # grouped by the whole name (its head and digest: answerbytes.grouped), answered with the name as shown
    keys = "name_head, name_digest, style" if spec.styled else "name_head, name_digest"
    sql = f"""
SELECT {answerbytes.shown("name_head", "name_bytes")} AS name{style}, instances, total_{u}, avg_{u}, med_{u},
       min_{u}, max_{u}, stddev_{u}, {"time_pct" if u == "ns" else "pct"},
       {answerbytes.cut("name_head", "name_bytes")} AS name_cut
FROM (
    SELECT {keys}, any(name_bytes) AS name_bytes, count() AS instances, {capped_sum("v")} AS total_{u},
           avg(toFloat64(v)) AS avg_{u},
           quantileExactInclusive(0.5)(v) AS med_{u}, min(v) AS min_{u}, max(v) AS max_{u},
           if(count() > 1, stddevSamp(v), 0) AS stddev_{u},
           100 * toFloat64(total_{u}) / sum(toFloat64(total_{u})) OVER () AS {"time_pct" if u == "ns" else "pct"}
    FROM (SELECT {answerbytes.grouped("name")}, {"extras['style'] AS style, " if spec.styled else ""}{spec.measure} AS v
          FROM {{db}}.events WHERE kind IN {{summary_kinds:Array(String)}} AND {where.sql()})
    GROUP BY {keys}
    ORDER BY total_{u} DESC, {keys}
    {"LIMIT {limit:UInt32}" if limit else ""}
)"""
    strings = ("name", "style") if spec.styled else ("name",)
    return answerbytes.bounded(sql, f"total_{u} DESC, name{style}", strings), {
        **where.params, "summary_kinds": list(spec.kinds), "limit": limit,
    }  # fmt: skip


def tag_predicates(where: Predicates, tags: Mapping[str, str]) -> Predicates:
    """Runs carrying every one of `tags`. A missing key reads as '' from a ClickHouse map:
    mapContains keeps it from matching an empty value."""
    for i, (key, value) in enumerate(sorted(tags.items())):
        where.add(
            f"mapContains(tags, {{tag_key_{i}:String}}) AND tags[{{tag_key_{i}:String}}] = {{tag_value_{i}:String}}",
            **{f"tag_key_{i}": key, f"tag_value_{i}": value},
        )
    return where


def runs(
    host: str, source: str, name_contains: str, limit: int, tags: Mapping[str, str] | None = None
) -> tuple[str, dict[str, object]]:
    where = tag_predicates(Predicates(), tags or {})
    if host:
        where.add("host = {host:String}", host=host)
    if source:
        where.add("source = {source:String}", source=source)
    if name_contains:
        where.add(
            "(positionCaseInsensitiveUTF8(name, {needle:String}) > 0"
            " OR positionCaseInsensitive(run_id, {needle:String}) > 0)",
            needle=name_contains,
        )
    where.add("NOT importing")
    sql = f"""
SELECT run_id, name, host, source, toUnixTimestamp64Nano(start) AS start_ns,
       toUnixTimestamp64Nano(end) AS end_ns, relative_time, tags, attrs
FROM {{db}}.runs FINAL WHERE {where.sql()}
ORDER BY start DESC, run_id LIMIT {{limit:UInt32}}
"""
    return sql, {**where.params, "limit": limit}


def run_span() -> str:
    return """
SELECT host, toUnixTimestamp64Nano(start) AS start_ns, toUnixTimestamp64Nano(end) AS end_ns, relative_time,
       importing
FROM {db}.runs FINAL WHERE run_id = {run_id:String} LIMIT 1
"""


def run_rows_exist() -> str:
    return """
SELECT 1 FROM (SELECT 1 FROM {db}.events WHERE run_id = {run_id:String} LIMIT 1
               UNION ALL SELECT 1 FROM {db}.samples WHERE run_id = {run_id:String} LIMIT 1) LIMIT 1
"""


def devices(host: str, limit: int) -> tuple[str, dict[str, object]]:
    clause = "host = {host:String}" if host else "1"
    sql = f"""
SELECT host, gpu, uuid, name, memory_total, sm_count, driver, pci_bus_id, run_id, attrs
FROM {{db}}.devices FINAL WHERE {clause} ORDER BY host, gpu, uuid LIMIT {{limit:UInt32}}
"""
    return sql, {"host": host, "limit": limit}


def kinds_filter(where: Predicates, kinds: Sequence[str], names: Sequence[str]) -> Predicates:
    if kinds:
        where.add("kind IN {kinds:Array(String)}", kinds=list(kinds))
    if names:
        where.add("name IN {names:Array(String)}", names=list(names))
    return where
