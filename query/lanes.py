"""The SQL of the timeline's lanes: events quantized to a time grid, as a zoomed-out timeline
draws them (a slice narrower than a pixel is not drawn, it is counted). Pure: text and bound
parameters.

A lane is what a timeline shows as one row: GPU work (kernels and memory operations) per GPU
and stream; everything else per kind, process, thread and nesting depth.
"""

from __future__ import annotations

from query import answerbytes
from query.gpuwork import NS, WORK_KINDS, Query
from query.window import Predicates, ns


def event_span(where: Predicates) -> Query:
    """First start and last end of the events in the window, and their count."""
    sql = (
        f"SELECT min({NS}(start)) AS first, max({NS}(end)) AS last, count() AS n FROM {{db}}.events WHERE {where.sql()}"
    )
    return sql, where.params


def lanes(where: Predicates, start: int, end: int, width: int) -> Query:
    """Per lane and bucket of `width` ns from `start`: the events overlapping it, the time they
    cover in it up to `end` (at most the width), and the name whose events cover most of it (as shown,
    top_name_cut where cut); as many rows as fit in an answer (query/answerbytes.py)."""
    clipped_start = f"greatest({NS}(start), {{grid_start:Int64}})"
    clipped_end = f"least({NS}(end), {{grid_end:Int64}})"
    top_name, top_cut = answerbytes.shown("name_head", "full_bytes"), answerbytes.cut("name_head", "full_bytes")
    sql = f"""
SELECT lane_kind AS lane, host, gpu, stream, lane_pid AS pid, lane_tid AS tid, lane_depth AS depth,
       {{grid_start:Int64}} + b * {{width:Int64}} AS bucket_start_ns, sum(named) AS events,
       least(sum(covered), {{width:Int64}}) AS busy_ns, argMax(({top_name}, {top_cut}), covered) AS top,
       top.1 AS top_name, top.2 AS top_name_cut
FROM (
    SELECT lane_kind, host, gpu, stream, lane_pid, lane_tid, lane_depth, b, name_head, name_digest,
           any(name_bytes) AS full_bytes, count() AS named,
           sum(least(e, {{grid_start:Int64}} + (b + 1) * {{width:Int64}})
               - greatest(s, {{grid_start:Int64}} + b * {{width:Int64}})) AS covered
    FROM (
        SELECT host, gpu, stream, {answerbytes.grouped("name")}, if(kind IN {WORK_KINDS}, 'gpu', kind) AS lane_kind,
               if(lane_kind = 'gpu', 0, pid) AS lane_pid, if(lane_kind = 'gpu', 0, tid) AS lane_tid,
               if(lane_kind = 'gpu', 0, depth) AS lane_depth, {clipped_start} AS s, {clipped_end} AS e,
               arrayJoin(range(intDiv(s - {{grid_start:Int64}}, {{width:Int64}}),
                               intDiv(greatest(e - 1, s) - {{grid_start:Int64}}, {{width:Int64}}) + 1)) AS b
        FROM {{db}}.events
        WHERE {where.sql()} AND start < {ns("grid_end")}
          AND (end > {ns("grid_start")} OR (end = start AND start = {ns("grid_start")}))
    )
    GROUP BY lane_kind, host, gpu, stream, lane_pid, lane_tid, lane_depth, b, name_head, name_digest
)
GROUP BY lane_kind, host, gpu, stream, lane_pid, lane_tid, lane_depth, b"""
    order = "lane, host, gpu, stream, pid, tid, depth, bucket_start_ns"
    return answerbytes.bounded(sql, order, ("lane", "host", "top_name"), drop=("top",)), {
        **where.params, "grid_start": start, "grid_end": end, "width": width,
    }  # fmt: skip
