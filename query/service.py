"""The gRPC Query service: requests in, SQL to the store, columnar answers out."""

from __future__ import annotations

import itertools
import shlex
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from query import analysis, answerbytes, lanes, sql, verdict
from query.compare_answer import compare_table
from query.keeper import kept_phases
from query.kept import kept_runs
from query.requestchecks import bounded, check_kinds, check_tags, window_of
from query.window import (
    Predicates,
    RunSpan,
    Window,
    bounds,
    event_predicates,
    names,
    run_named,
    runs_named_like,
    sample_predicates,
)
from store.store import Store
from store.storeerrors import QueryTooLarge, StoreError, StoreUnavailable
from store.usersql import ipc_bytes
from tracehouse.requesterrors import QueryError, RunNotFound
from tracehouse.units import instant
from tracehouse.v1 import batch_pb2, query_pb2, query_pb2_grpc

DEFAULT_MIN_GAP_NS = 1_000_000
DEFAULT_SHORT_NS = 10_000
NAMESAKES_SHOWN = 5  # runs listed when a name is ambiguous


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


class QueryService(query_pb2_grpc.QueryServicer):
    def __init__(self, store: Store) -> None:
        self.store = store
        self.limits = store.limits

    def _scope(self, message: query_pb2.Window) -> tuple[Window, RunSpan | None]:
        """The window a request asks about, with its run; an NVTX range instance becomes its span."""
        window = window_of(message, self.limits)
        run = self._run(window)
        if not message.range_name:
            return window, run
        instance = message.range_instance or 1
        text, params = analysis.range_instance(event_predicates(window, run), message.range_name, instance)
        found = self.store.query(text, params).to_pylist()
        if not found:
            raise RunNotFound(f"no instance {instance} of range {message.range_name[:200]!r} in the window")
        span = replace(window, from_ns=found[0]["s"], to_ns=max(found[0]["e"], found[0]["s"] + 1))
        return span.check(self.limits), run

    def _run(self, window: Window, field: str = "window.run_id") -> RunSpan | None:
        """The window's run: by its id, else by its name where one run has that name."""
        if not window.run_id:
            return None
        found = _rows(self.store.query(sql.run_span(), {"run_id": window.run_id}))
        if not found:
            # rows that name a run nobody described: the run is just those rows
            if self.store.query(sql.run_rows_exist(), {"run_id": window.run_id}).num_rows:
                return RunSpan(window.run_id, "", 0, None, relative_time=True)
            return self._run(replace(window, run_id=self._named(window.run_id, field)), field)
        row = found[0]
        if row["importing"]:
            raise RunNotFound(f"run {window.run_id!r} is still being imported")
        return RunSpan(window.run_id, row["host"], row["start_ns"], row["end_ns"], bool(row["relative_time"]))

    @staticmethod
    def _nearby(name: str) -> dict[str, object]:
        """Names within a few edits of `name` (a quarter of its length, at least 1, at most 3), three at most."""
        return {"name": name[:256], "most": min(3, max(1, len(name) // 4)), "limit": 3}

    def _named(self, name: str, field: str) -> str:
        """The id of the one run called `name`; none or several: a refusal that says how to find or pick one."""
        runs = _rows(self.store.query(run_named(), {"name": name, "limit": NAMESAKES_SHOWN + 1}))
        if len(runs) == 1:
            return str(runs[0]["run_id"])
        if not runs:
            near = [row["name"] for row in _rows(self.store.query(runs_named_like(), self._nearby(name)))]
            if near:
                meant = " or ".join(repr(other) for other in near)
                raise RunNotFound(
                    f"{field}: run {name[:200]!r} not found: no run has that id or name; did you mean {meant}? "
                    f"To list them: tracehouse query runs --name {shlex.quote(near[0])}"
                )
            raise RunNotFound(
                f"{field}: run {name[:200]!r} not found: no run has that id or name; to list the runs whose name "
                f"or id contains it: tracehouse query runs --name {shlex.quote(name[:200])}"
            )
        listed = "; ".join(
            f"{shlex.quote(run['run_id'])} (host {run['host']}, started {instant(run['start_ns'])})"
            for run in runs[:NAMESAKES_SHOWN]
        )
        many = f"more than {NAMESAKES_SHOWN}" if len(runs) > NAMESAKES_SHOWN else str(len(runs))
        raise QueryError(field, f"{many} runs are named {name[:200]!r}: {listed}; name one by its run id")

    def ListRuns(self, request: query_pb2.ListRunsRequest, context: Any) -> query_pb2.ListRunsResponse:
        limit = bounded(request.limit, self.limits.max_list_rows, self.limits.max_list_rows, "limit")
        tags = check_tags("tags", request.tags, self.limits)
        text, params = sql.runs(request.host, request.source, request.name_contains, limit, tags)
        answer = query_pb2.ListRunsResponse()
        for row in _rows(self.store.query(text, params)):
            run = answer.runs.add(
                run_id=row["run_id"],
                name=row["name"],
                host=row["host"],
                source=row["source"],
                start=row["start_ns"],
                relative_time=bool(row["relative_time"]),
            )
            if row["end_ns"] is not None:
                run.end = row["end_ns"]
            run.tags.update(dict(row["tags"]))
            run.attrs.update(dict(row["attrs"]))
        self._within(answer.ByteSize())
        return answer

    def ListDevices(self, request: query_pb2.ListDevicesRequest, context: Any) -> query_pb2.ListDevicesResponse:
        text, params = sql.devices(request.host, self.limits.max_list_rows)
        answer = query_pb2.ListDevicesResponse()
        for row in _rows(self.store.query(text, params)):
            attrs = dict(row.pop("attrs"))
            answer.devices.add(**row).attrs.update(attrs)
        self._within(answer.ByteSize())
        return answer

    def ListMetrics(self, request: query_pb2.ListMetricsRequest, context: Any) -> query_pb2.ListMetricsResponse:
        window, run = self._scope(request.window)
        where = sample_predicates(window, run)
        text, params = sql.metrics(where, self.limits.max_list_rows)
        answer = query_pb2.ListMetricsResponse()
        for row in _rows(self.store.query(text, params)):
            answer.metrics.add(**row)
        self._within(answer.ByteSize())
        return answer

    def Series(self, request: query_pb2.SeriesRequest, context: Any) -> query_pb2.SeriesResponse:
        metric_names = names("metrics", request.metrics, self.limits)
        if not metric_names:
            raise QueryError("metrics", "name at least one metric")
        max_points = bounded(request.max_points, self.limits.default_points, self.limits.max_points, "max_points")
        window, run = self._scope(request.window)
        where = sample_predicates(window, run)
        selects = sample_predicates(window, run, times=False)
        where.params["metrics"] = selects.params["metrics"] = metric_names
        start, end = bounds(window, run)
        if start is None or end is None or end - start > sql.MAX_SERIES_SPAN_NS:
            span = self._data_span(where, selects, start, end)
            if span is None:
                return query_pb2.SeriesResponse(bucket_ns=0)
            start = span[0] if start is None else max(start, span[0])
            end = span[1] if end is None else min(end, span[1])
            if end <= start:
                return query_pb2.SeriesResponse(bucket_ns=0)
        width = sql.bucket_width(start, end, max_points)
        origin = start - start % width
        text, params = sql.series(where, origin, width, sql.rollup_for(start, end, width), selects)
        table = self.store.query(text, params)
        answer = query_pb2.SeriesResponse(bucket_ns=width)
        if table.num_rows == 0:
            return answer
        keys = table.select(["host", "gpu", "pid", "metric"]).to_pylist()
        columns = {name: table.column(name).to_numpy() for name in ("bucket_start", "min", "avg", "max", "count")}
        boundaries = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
        for lo, hi in itertools.pairwise(boundaries):
            series = answer.series.add(**keys[lo])
            series.bucket_start.extend(columns["bucket_start"][lo:hi].tolist())
            series.min.extend(columns["min"][lo:hi].tolist())
            series.avg.extend(columns["avg"][lo:hi].tolist())
            series.max.extend(columns["max"][lo:hi].tolist())
            series.count.extend(columns["count"][lo:hi].tolist())
        self._within(answer.ByteSize())
        return answer

    def _data_span(
        self, where: Predicates, selects: Predicates, start: int | None, end: int | None
    ) -> tuple[int, int] | None:
        """[first, last + 1) of the samples in an open window: found to the minute in the
        coarsest rollup, then to the ns in the raw samples of those two minutes."""
        first_row, last_row, count = _first_row(self.store.query(*sql.series_span(selects, start, end)))
        if not count:
            return None
        first, last = _first_row(self.store.query(*sql.series_ends(where, first_row, last_row)))
        # raw samples past their retention, with rollups kept longer: the rollup's span
        return (first_row if first is None else first), (
            last_row + sql.COARSEST_ROLLUP[1] if last is None else last + 1
        )

    def Events(self, request: query_pb2.EventsRequest, context: Any) -> query_pb2.EventsResponse:
        window, run = self._scope(request.window)
        check_kinds(request.kinds)
        page_size = bounded(request.page_size, self.limits.default_page_size, self.limits.max_page_size, "page_size")
        after = sql.parse_page_token(request.page_token)
        where = sql.kinds_filter(
            event_predicates(window, run),
            list(request.kinds),
            names("names", request.names, self.limits),
        )
        # the page ends where its rows fill page_size or the answer's bytes, whichever comes first
        sizes = self.store.query(*sql.event_sizes(where, page_size, after))
        fits = answerbytes.rows_within(sizes.column("row_bytes").to_numpy()[:page_size], self.limits.max_answer_bytes)
        answer = query_pb2.EventsResponse()
        if not fits:
            return answer
        through = (sizes.column("start_ns")[fits - 1].as_py(), sizes.column("id")[fits - 1].as_py())
        table = self.store.query(*sql.events(where, fits, after, through))
        if table.num_rows > fits or sizes.num_rows > fits:
            table = table.slice(0, fits)
            last = table.slice(table.num_rows - 1, 1).to_pylist()[0]
            answer.next_page_token = sql.page_token(last["start_ns"], last["id"])
        _event_columns(table, answer)
        return answer

    def Lanes(self, request: query_pb2.LanesRequest, context: Any) -> query_pb2.LanesResponse:
        window, run = self._scope(request.window)
        check_kinds(request.kinds)
        buckets = bounded(request.buckets, self.limits.default_points, self.limits.max_points, "buckets")
        where = sql.kinds_filter(event_predicates(window, run), list(request.kinds), [])
        first, last, count = _first_row(self.store.query(*lanes.event_span(where)))
        start, end = bounds(window, run)
        if not count:
            return query_pb2.LanesResponse()
        start = first if start is None else start
        end = last + 1 if end is None else end
        if end <= start:  # the run's span and the window do not meet
            return query_pb2.LanesResponse()
        width = -(-(end - start) // buckets)
        return query_pb2.LanesResponse(
            start_ns=start, bucket_ns=width, buckets=buckets, events=count,
            lanes=self._bounded_table(*lanes.lanes(where, start, end, width)),
        )  # fmt: skip

    def Summary(self, request: query_pb2.SummaryRequest, context: Any) -> query_pb2.Table:
        window, run = self._scope(request.window)
        return self._bounded_table(*sql.summary(event_predicates(window, run), request.kind, request.limit))

    def _table(self, text: str, params: dict[str, object]) -> query_pb2.Table:
        return self._answer(self.store.query(text, params))

    def _answer(self, table: pa.Table, truncated: bool = False) -> query_pb2.Table:
        """`table` as an answer, refused over max_answer_bytes (its query does not bound its bytes itself)."""
        data = ipc_bytes(table)
        self._within(len(data))
        return query_pb2.Table(arrow_ipc=data, rows=table.num_rows, truncated=truncated)

    def _within(self, size: int) -> None:
        """Refuse an answer of `size` bytes over max_answer_bytes (where its query does not bound them itself)."""
        if size > self.limits.max_answer_bytes:
            raise QueryError("answer", f"{size} bytes; one answer holds at most {self.limits.max_answer_bytes}: "
                             "ask about a shorter window, fewer runs or fewer rows (limit)")  # fmt: skip

    def _bounded_table(self, text: str, params: dict[str, object]) -> query_pb2.Table:
        """The answer of answerbytes.bounded SQL: truncated when its bytes left rows out."""
        table, truncated = answerbytes.counted(self.store.query(text, {**params, **answerbytes.params(self.limits)}))
        return query_pb2.Table(arrow_ipc=ipc_bytes(table), rows=table.num_rows, truncated=truncated)

    # -- analyses -----------------------------------------------------------------------

    def GpuTime(self, request: query_pb2.GpuTimeRequest, context: Any) -> query_pb2.GpuTimeResponse:
        window, run = self._scope(request.window)
        clip_from, clip_to = bounds(window, run)
        min_gap = request.min_gap_ns or DEFAULT_MIN_GAP_NS
        if min_gap < 0:
            raise QueryError("min_gap_ns", "must not be negative")
        max_gaps = bounded(request.max_gaps, 1000, self.limits.max_list_rows, "max_gaps")
        kept = self._kept(run.run_id) if run is not None else None
        whole = kept is not None and self._holds_every_island(kept, clip_from, clip_to)
        table = self.store.query(
            *analysis.gpu_time(event_predicates(window, run), clip_from, clip_to, min_gap, max_gaps, kept, whole)
        )
        gaps = _unfold_gaps(table, max_gaps)
        gpus = table.drop_columns(["gaps", "long_gaps"])
        count = sum(table.column("long_gaps").to_pylist())
        return query_pb2.GpuTimeResponse(
            gpus=query_pb2.Table(arrow_ipc=ipc_bytes(gpus), rows=gpus.num_rows),
            gaps=query_pb2.Table(arrow_ipc=ipc_bytes(gaps), rows=gaps.num_rows),
            gap_count=count,
        )

    def _kept(self, run_id: str) -> tuple[str, int] | None:
        """(run id, fingerprint) when what is kept of the run holds for its rows (query/kept.py)."""
        rows = self.store.query(kept_runs("SELECT {run_id:String}"), {"run_id": run_id}).to_pylist()
        return (run_id, rows[0]["generation"]) if rows and rows[0]["kept"] else None

    def _holds_every_island(self, kept: tuple[str, int], clip_from: int | None, clip_to: int | None) -> bool:
        first, last = _first_row(self.store.query(*analysis.kept_span(kept)))
        return (clip_from is None or clip_from <= first) and (clip_to is None or last <= clip_to)

    def NvtxGpu(self, request: query_pb2.NvtxGpuRequest, context: Any) -> query_pb2.NvtxGpuResponse:
        window, run = self._scope(request.window)
        limit = bounded(request.limit, 0, self.limits.max_list_rows, "limit")
        runs = self.store.query(*analysis.kept_in_window(event_predicates(window, run))).to_pylist()
        kept = [(row["run_id"], row["generation"]) for row in runs if row["kept"]]
        others = len(kept) < len(runs)
        answer = query_pb2.NvtxGpuResponse(
            summary=self._table(*analysis.nvtx_gpu_summary(event_predicates(window, run), kept, others))
        )
        if limit:
            answer.ranges.CopyFrom(self._table(*analysis.nvtx_gpu_ranges(event_predicates(window, run), limit)))
        return answer

    def Phases(self, request: query_pb2.PhasesRequest, context: Any) -> query_pb2.Table:
        window, run = self._scope(request.window)
        where = event_predicates(window, run)
        whole = not (window.hosts or window.gpus) and window.from_ns is None and window.to_ns is None
        kept = self._kept(run.run_id) if run is not None and whole else None
        if kept is None:
            return self._table(*analysis.phases(where))
        answer, rows = kept_phases(self.store, kept, where)
        return query_pb2.Table(arrow_ipc=answer, rows=rows)

    def Launch(self, request: query_pb2.LaunchRequest, context: Any) -> query_pb2.LaunchResponse:
        window, run = self._scope(request.window)
        short = request.short_ns or DEFAULT_SHORT_NS
        if short < 0:
            raise QueryError("short_ns", "must not be negative")
        clip_from, clip_to = bounds(window, run)
        syncs = event_predicates(window, run)
        return query_pb2.LaunchResponse(
            latency=self._table(*analysis.launch_latency(event_predicates(window, run))),
            short_kernels=self._table(*analysis.short_kernels(event_predicates(window, run), short)),
            idle_after_sync=self._table(
                *analysis.idle_after_sync(event_predicates(window, run), syncs, clip_from, clip_to)
            ),
        )

    def Diff(self, request: query_pb2.DiffRequest, context: Any) -> query_pb2.Table:
        pair = []
        for field, run_id in (("run_a", request.run_a), ("run_b", request.run_b)):
            if not run_id:
                raise QueryError(field, "required")
            span = self._run(Window(run_id=run_id).check(self.limits), field)
            pair.append(span.run_id if span else run_id)
        summaries = list(request.summaries) or list(analysis.DIFF_CATEGORIES)
        for name in summaries:
            if name not in analysis.DIFF_CATEGORIES:
                raise QueryError("summaries", f"{name[:64]!r} is not one of {', '.join(analysis.DIFF_CATEGORIES)}")
        return self._table(*analysis.diff(pair[0], pair[1], summaries, request.limit))

    def Compare(self, request: query_pb2.CompareRequest, context: Any) -> query_pb2.Table:
        run_ids = list(dict.fromkeys(request.run_ids))  # each once, in the order named
        if len(run_ids) > analysis.MAX_COMPARE_RUNS:
            raise QueryError("run_ids", f"{len(run_ids)} runs; the limit is {analysis.MAX_COMPARE_RUNS}")
        for run_id in run_ids:
            Window(run_id=run_id).check(self.limits)
        tags = check_tags("tags", request.tags, self.limits)
        if not run_ids and not tags:
            raise QueryError("run_ids", "name at least one run, or tags that select runs")
        top = bounded(request.top_kernels, 3, 100, "top_kernels")
        found = self._compared(run_ids, tags, "run_ids")
        runs = found[: analysis.MAX_COMPARE_RUNS]
        table = compare_table(runs, top, self._rows_of)
        return self._answer(table, truncated=len(found) > len(runs))

    def _rows_of(self, text: str, params: dict[str, object]) -> list[dict[str, Any]]:
        return _rows(self.store.query(text, params))

    def _compared(self, run_ids: list[str], tags: dict[str, str], field: str) -> list[dict[str, Any]]:
        """Rows of compare_runs: the runs named (ids, or names that one run has), then those with
        every one of `tags`; at most MAX_COMPARE_RUNS + 1 (one more says there were more)."""
        found = self._rows_of(*analysis.compare_runs(run_ids, tags, analysis.MAX_COMPARE_RUNS + 1))
        named = {row["run_id"]: row for row in found if row["wanted"]}
        if any(run_id not in named for run_id in run_ids):  # names for runs, where one run has the name
            run_ids = list(dict.fromkeys(r if r in named else self._named(r, field) for r in run_ids))
            found = self._rows_of(*analysis.compare_runs(run_ids, tags, analysis.MAX_COMPARE_RUNS + 1))
            named = {row["run_id"]: row for row in found if row["wanted"]}
        for run_id in run_ids:
            if run_id not in named:
                raise RunNotFound(f"run {run_id!r} not found")
            if named[run_id]["importing"]:
                raise RunNotFound(f"run {run_id!r} is still being imported")
        return found

    def Verdict(self, request: query_pb2.VerdictRequest, context: Any) -> query_pb2.VerdictResponse:
        options = verdict.VerdictOptions(
            measures=tuple(dict.fromkeys(request.measures)),
            skip=request.skip if request.HasField("skip") else None,
            step_pattern=request.step_pattern or verdict.DEFAULT_STEP_PATTERN,
            window_ns=request.window_ns or verdict.DEFAULT_WINDOW_NS,
            min_effect=request.min_effect or verdict.DEFAULT_MIN_EFFECT,
        ).check()
        try:  # the engine's own regular expressions (RE2) decide
            self.store.query("SELECT match('', {pattern:String}) AS matched", {"pattern": options.step_pattern})
        except (StoreUnavailable, QueryTooLarge):  # busy, or past a bound: not the pattern's fault
            raise
        except StoreError:
            raise QueryError("step_pattern", "not a regular expression RE2 accepts (RE2 has no look-around, "
                             "no back-references)") from None  # fmt: skip
        groups = {"A": self._group(request.a, "a"), "B": self._group(request.b, "b")}
        shared = {run["run_id"] for run in groups["A"]} & {run["run_id"] for run in groups["B"]}
        if shared:
            raise QueryError("b", f"run {sorted(shared)[0]!r} is in both groups")
        runs = [*groups["A"], *groups["B"]]
        compared = compare_table(runs, 1, self._rows_of).to_pylist()
        gpus = {row["run_id"]: tuple(int(g) for g in (row["gpu_indices"] or "").split(",") if g) for row in compared}
        evidence, notes = verdict.gather(groups, gpus, options, self.store.query)
        tables = {
            "measures": verdict.measures_table(evidence, options), "parts": verdict.parts_table(evidence),
            "phases": verdict.parts_table(evidence, "phases"), "runs": verdict.runs_table(evidence),
            "phase_work": verdict.parts_table(evidence, "phase_work"),
        }  # fmt: skip
        return query_pb2.VerdictResponse(notes=notes, **{
            name: query_pb2.Table(arrow_ipc=ipc_bytes(table), rows=table.num_rows) for name, table in tables.items()
        })  # fmt: skip

    def _group(self, group: query_pb2.RunGroup, field: str) -> list[dict[str, Any]]:
        """One side's runs: those named, or those carrying every tag; with steps or not."""
        run_ids = list(dict.fromkeys(group.run_ids))
        tags = check_tags(f"{field}.tags", group.tags, self.limits)
        if bool(run_ids) == bool(tags):
            raise QueryError(field, "name its runs, or tags that select them (not both)")
        if len(run_ids) > verdict.MAX_GROUP_RUNS:
            raise QueryError(f"{field}.run_ids", f"{len(run_ids)} runs; the limit is {verdict.MAX_GROUP_RUNS}")
        for run_id in run_ids:
            Window(run_id=run_id).check(self.limits)
        found = self._compared(run_ids, tags, f"{field}.run_ids")
        if not found:
            raise RunNotFound(f"no run carries the tags {', '.join(f'{k}={v}' for k, v in sorted(tags.items()))}")
        if len(found) > verdict.MAX_GROUP_RUNS:
            raise QueryError(f"{field}.tags", f"more than {verdict.MAX_GROUP_RUNS} runs carry these tags")
        return [run for run in found if not run["importing"]]

    def Job(self, request: query_pb2.JobRequest, context: Any) -> query_pb2.JobResponse:
        from query.jobservice import job_response

        return job_response(self.store, request, self._within)

    def Sql(self, request: query_pb2.SqlRequest, context: Any) -> query_pb2.Table:
        if not request.sql.strip():
            raise QueryError("sql", "empty")
        if len(request.sql) > self.limits.max_string_bytes:
            raise QueryError("sql", f"longer than {self.limits.max_string_bytes} bytes")
        data, rows, truncated = self.store.user_sql(request.sql, request.max_rows)
        return query_pb2.Table(arrow_ipc=data, rows=rows, truncated=truncated)


def _unfold_gaps(table: pa.Table, limit: int) -> pa.Table:
    """The per-GPU arrays of longest gaps as one table, longest first over every GPU."""
    rows = [
        {"host": host, "gpu": gpu, "start_ns": start, "end_ns": end, "length_ns": length}
        for host, gpu, longest in zip(*(table.column(c).to_pylist() for c in ("host", "gpu", "gaps")), strict=True)
        for start, end, length in (gap.values() for gap in longest or [])  # each gap arrives as a struct
    ]
    rows.sort(key=lambda r: (-r["length_ns"], r["host"], r["gpu"], r["start_ns"]))
    schema = pa.schema([("host", pa.string()), ("gpu", pa.int16()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                        ("length_ns", pa.int64())])  # fmt: skip
    return pa.Table.from_pylist(rows[:limit], schema=schema)


def _first_row(table: pa.Table) -> tuple[Any, ...]:
    return tuple(table.column(i)[0].as_py() for i in range(table.num_columns))


def _event_columns(table: pa.Table, answer: query_pb2.EventsResponse) -> None:
    """Fill the answer's dictionary-encoded columns from a query result."""
    strings: dict[str, int] = {}

    def codes(column: str) -> list[int]:
        encoded = pc.dictionary_encode(table.column(column)).combine_chunks()
        local = [strings.setdefault(s, len(strings)) for s in encoded.dictionary.to_pylist()]
        return np.asarray(local, dtype=np.uint32)[encoded.indices.to_numpy()].tolist() if local else []

    events: batch_pb2.EventColumns = answer.events
    for column in ("run", "host", "kind", "name"):
        getattr(events, column).extend(codes("run_id" if column == "run" else column))
    for column in ("start", "end", "launch_start"):
        getattr(events, column).extend(table.column(f"{column}_ns").to_numpy().tolist())
    for column in ("gpu", "stream", "pid", "tid", "correlation_id", "bytes", "depth", "id"):
        getattr(events, column).extend(table.column(column).to_numpy().tolist())
    for row, extras in enumerate(table.column("extras").to_pylist()):
        for key, value in extras:
            events.extra_row.append(row)
            events.extra_key.append(strings.setdefault(key, len(strings)))
            events.extra_value.append(strings.setdefault(value, len(strings)))
    answer.dictionary.extend(strings)
