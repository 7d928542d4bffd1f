"""The gRPC Query service: requests in, SQL to the store, columnar answers out."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.store import Store, ipc_bytes
from query import sql
from query.window import (
    QueryError,
    RunNotFound,
    RunSpan,
    Window,
    bounds,
    event_predicates,
    names,
    sample_predicates,
)
from tracehouse.model import EVENT_KINDS, Limits
from tracehouse.v1 import batch_pb2, query_pb2, query_pb2_grpc


def window_of(message: query_pb2.Window, limits: Limits) -> Window:
    return Window(
        run_id=message.run_id,
        hosts=tuple(message.hosts),
        gpus=tuple(message.gpus),
        from_ns=message.from_ns if message.HasField("from_ns") else None,
        to_ns=message.to_ns if message.HasField("to_ns") else None,
    ).check(limits)


def _bounded(value: int, default: int, maximum: int, field: str) -> int:
    if value > maximum:
        raise QueryError(field, f"{value} is over the limit of {maximum}")
    return value or default


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


class QueryService(query_pb2_grpc.QueryServicer):
    def __init__(self, store: Store) -> None:
        self.store = store
        self.limits = store.limits

    def _run(self, window: Window) -> RunSpan | None:
        if not window.run_id:
            return None
        found = _rows(self.store.query(sql.run_span(), {"run_id": window.run_id}))
        if not found:
            # rows that name a run nobody described: the run is just those rows
            if self.store.query(sql.run_rows_exist(), {"run_id": window.run_id}).num_rows:
                return RunSpan(window.run_id, "", 0, None, relative_time=True)
            raise RunNotFound(f"run {window.run_id!r} not found")
        row = found[0]
        if row["importing"]:
            raise RunNotFound(f"run {window.run_id!r} is still being imported")
        return RunSpan(window.run_id, row["host"], row["start_ns"], row["end_ns"], bool(row["relative_time"]))

    def ListRuns(self, request: query_pb2.ListRunsRequest, context: Any) -> query_pb2.ListRunsResponse:
        limit = _bounded(request.limit, self.limits.max_list_rows, self.limits.max_list_rows, "limit")
        text, params = sql.runs(request.host, request.source, request.name_contains, limit)
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
        return answer

    def ListDevices(self, request: query_pb2.ListDevicesRequest, context: Any) -> query_pb2.ListDevicesResponse:
        text, params = sql.devices(request.host, self.limits.max_list_rows)
        answer = query_pb2.ListDevicesResponse()
        for row in _rows(self.store.query(text, params)):
            attrs = dict(row.pop("attrs"))
            answer.devices.add(**row).attrs.update(attrs)
        return answer

    def ListMetrics(self, request: query_pb2.ListMetricsRequest, context: Any) -> query_pb2.ListMetricsResponse:
        window = window_of(request.window, self.limits)
        where = sample_predicates(window, self._run(window))
        text, params = sql.metrics(where, self.limits.max_list_rows)
        answer = query_pb2.ListMetricsResponse()
        for row in _rows(self.store.query(text, params)):
            answer.metrics.add(**row)
        return answer

    def Series(self, request: query_pb2.SeriesRequest, context: Any) -> query_pb2.SeriesResponse:
        window = window_of(request.window, self.limits)
        metric_names = names("metrics", request.metrics, self.limits)
        if not metric_names:
            raise QueryError("metrics", "name at least one metric")
        max_points = _bounded(request.max_points, self.limits.default_points, self.limits.max_points, "max_points")
        run = self._run(window)
        where = sample_predicates(window, run)
        where.params["metrics"] = metric_names
        start, end = bounds(window, run)
        if start is None or end is None or end - start > sql.MAX_SERIES_SPAN_NS:
            # an open or absurdly wide window: the data's own span within it
            text, params = sql.series_bounds(where)
            first, last, count = _first_row(self.store.query(text, params))
            if not count:
                return query_pb2.SeriesResponse(bucket_ns=0)
            start = first if start is None else max(start, first)
            end = last + 1 if end is None else min(end, last + 1)
        width = sql.bucket_width(start, end, max_points)
        origin = start - start % width
        text, params = sql.series(where, origin, width)
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
        return answer

    def Events(self, request: query_pb2.EventsRequest, context: Any) -> query_pb2.EventsResponse:
        window = window_of(request.window, self.limits)
        for kind in request.kinds:
            if kind not in EVENT_KINDS:
                raise QueryError("kinds", f"unknown kind {kind[:64]!r}; known: {', '.join(EVENT_KINDS)}")
        page_size = _bounded(request.page_size, self.limits.default_page_size, self.limits.max_page_size, "page_size")
        after = sql.parse_page_token(request.page_token)
        where = sql.kinds_filter(
            event_predicates(window, self._run(window)),
            list(request.kinds),
            names("names", request.names, self.limits),
        )
        text, params = sql.events(where, page_size, after)
        table = self.store.query(text, params)
        answer = query_pb2.EventsResponse()
        if table.num_rows > page_size:
            table = table.slice(0, page_size)
            last = table.slice(page_size - 1, 1).to_pylist()[0]
            answer.next_page_token = sql.page_token(last["start_ns"], last["id"])
        _event_columns(table, answer)
        return answer

    def Summary(self, request: query_pb2.SummaryRequest, context: Any) -> query_pb2.Table:
        window = window_of(request.window, self.limits)
        where = event_predicates(window, self._run(window))
        text, params = sql.summary(where, request.kind, request.limit)
        table = self.store.query(text, params)
        return query_pb2.Table(arrow_ipc=ipc_bytes(table), rows=table.num_rows)

    def Sql(self, request: query_pb2.SqlRequest, context: Any) -> query_pb2.Table:
        if not request.sql.strip():
            raise QueryError("sql", "empty")
        if len(request.sql) > self.limits.max_string_bytes:
            raise QueryError("sql", f"longer than {self.limits.max_string_bytes} bytes")
        data, rows, truncated = self.store.user_sql(request.sql, request.max_rows)
        return query_pb2.Table(arrow_ipc=data, rows=rows, truncated=truncated)


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
