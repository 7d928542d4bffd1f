"""Python client for the Query service: every answer is a pandas DataFrame.

Times come back as `datetime64[ns, UTC]` columns; window bounds may be given as ns since
the epoch, ISO-8601 text, `now-5m`, or datetime/Timestamp objects.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pyarrow as pa

from query.captureframe import capture_dict
from query.jobclient import JobView, job_view_of
from tracehouse.channel import ClientSecurity, explain, open_channel
from tracehouse.config import default_server
from tracehouse.model import LANE_COLUMNS
from tracehouse.timefmt import parse_time
from tracehouse.v1 import capture_pb2, capture_pb2_grpc, query_pb2, query_pb2_grpc

TimeLike = int | str | dt.datetime | pd.Timestamp
EVENT_TIME_COLUMNS = ("start", "end", "launch_start")


class QueryFailed(Exception):
    """The server refused or could not answer; `code` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def to_ns(value: TimeLike) -> int:
    if isinstance(value, pd.Timestamp):
        stamp = value if value.tzinfo else value.tz_localize("UTC")
        return int(stamp.value)
    if isinstance(value, dt.datetime):
        return to_ns(pd.Timestamp(value))
    if isinstance(value, str):
        return parse_time(value)
    return int(value)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str | int):
        return [value]
    return list(value)


def make_window(
    run: str | None = None,
    host: str | Sequence[str] | None = None,
    gpu: int | Sequence[int] | None = None,
    start: TimeLike | None = None,
    end: TimeLike | None = None,
    range: str | None = None,
    instance: int | None = None,
) -> query_pb2.Window:
    """run, host, gpu, start, end; or range (an NVTX range name) and instance (from 1): the
    span of that instance of the range."""
    window = query_pb2.Window(
        run_id=run or "", hosts=_as_list(host), gpus=_as_list(gpu), range_name=range or "",
        range_instance=instance or 0,
    )  # fmt: skip
    if start is not None:
        window.from_ns = to_ns(start)
    if end is not None:
        window.to_ns = to_ns(end)
    return window


def _times(frame: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    for column in columns:
        if column in frame:
            frame[column] = pd.to_datetime(frame[column], unit="ns", utc=True)
    return frame


def _not_utf8(column: pa.ChunkedArray) -> bool:
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return False
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return True
    return False


def _text_or_bytes(value: bytes | None) -> str | bytes | None:
    try:
        return value.decode() if value is not None else None
    except UnicodeDecodeError:
        return value


def to_frame(table: pa.Table) -> pd.DataFrame:
    """A DataFrame that keeps integers exact: an integer column with gaps becomes pandas'
    nullable Int64, not float64 (which would round ns timestamps). A string that is not UTF-8
    (SQL's unhex, say) stays its bytes, exact, in a text column."""
    broken = [name for name, column in zip(table.column_names, table.columns, strict=True) if _not_utf8(column)]
    for name in broken:
        table = table.set_column(table.column_names.index(name), name, table.column(name).cast(pa.binary()))
    frame = table.to_pandas()
    for name in broken:
        frame[name] = pd.Series([_text_or_bytes(v) for v in frame[name]], index=frame.index, dtype=object)
    for name, column in zip(table.column_names, table.columns, strict=True):
        if column.null_count and pa.types.is_integer(column.type):
            frame[name] = pd.array(
                column.to_pylist(), dtype="UInt64" if pa.types.is_unsigned_integer(column.type) else "Int64"
            )
    return frame


def frame_of(message: query_pb2.Table) -> pd.DataFrame:
    return to_frame(arrow_table(message))


def arrow_table(message: query_pb2.Table) -> pa.Table:
    if not message.arrow_ipc:
        return pa.table({})
    return pa.ipc.open_stream(message.arrow_ipc).read_all()


class Client:
    """A connection to `tracehouse serve`. Window keywords on every method: run (an id, or a run's
    name where one run has it), host, gpu, start, end."""

    def __init__(
        self, server: str | None = None, timeout: float = 60.0, security: ClientSecurity | None = None
    ) -> None:
        """`security`: token and TLS (tracehouse.channel.client_security() reads them from the
        TRACEHOUSE_* variables); none, plain text without a token."""
        self.server = server or default_server()
        self.timeout = timeout
        self.security = security
        self._metadata = security.metadata() if security else ()
        self._channel = open_channel(self.server, security, [("grpc.max_receive_message_length", 256 << 20)])
        self._stub = query_pb2_grpc.QueryStub(self._channel)
        self._captures = capture_pb2_grpc.CaptureStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def job(self, job: str, steps: str = "", step_rows: bool = False) -> JobView:
        """A distributed job: ranks, stragglers and why, collectives; `steps`: only the steps whose number
        this regular expression finds; `step_rows`: every rank's steps too."""
        request = query_pb2.JobRequest(job=job, step_pattern=steps, step_rows=step_rows)
        return job_view_of(self._call("Job", request))

    def _call(self, method: str, request: Any, stub: Any = None) -> Any:
        try:
            return getattr(stub or self._stub, method)(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            code = error.code()
            raise QueryFailed(code, explain(code, error.details() or "", self.server, self.security)) from None

    def runs(
        self,
        host: str = "",
        source: str = "",
        name_contains: str = "",
        limit: int = 0,
        tags: Mapping[str, str] | None = None,
    ) -> pd.DataFrame:
        """Runs, newest first; `tags`: only runs carrying every one of these pairs."""
        request = query_pb2.ListRunsRequest(
            host=host, source=source, name_contains=name_contains, limit=limit, tags=dict(tags or {})
        )
        answer = self._call("ListRuns", request)
        rows = [
            {
                "run_id": r.run_id,
                "name": r.name,
                "host": r.host,
                "source": r.source,
                "start": r.start,
                "end": r.end if r.HasField("end") else None,
                "relative_time": r.relative_time,
                "tags": dict(r.tags),
                "attrs": dict(r.attrs),
            }
            for r in answer.runs
        ]
        columns = ["run_id", "name", "host", "source", "start", "end", "relative_time", "tags", "attrs"]
        frame = pd.DataFrame(rows, columns=columns)
        frame["end"] = frame["end"].astype("Int64")
        return _times(frame, ("start", "end"))

    def devices(self, host: str = "") -> pd.DataFrame:
        answer = self._call("ListDevices", query_pb2.ListDevicesRequest(host=host))
        columns = [
            "host",
            "gpu",
            "uuid",
            "name",
            "memory_total",
            "sm_count",
            "driver",
            "pci_bus_id",
            "run_id",
        ]
        rows = [{**{c: getattr(d, c) for c in columns}, "attrs": dict(d.attrs)} for d in answer.devices]
        return pd.DataFrame(rows, columns=[*columns, "attrs"])

    def metrics(self, **window: Any) -> pd.DataFrame:
        answer = self._call("ListMetrics", query_pb2.ListMetricsRequest(window=make_window(**window)))
        columns = ["host", "gpu", "pid", "metric", "samples", "first_ns", "last_ns"]
        frame = pd.DataFrame([{c: getattr(m, c) for c in columns} for m in answer.metrics], columns=columns)
        frame = frame.rename(columns={"first_ns": "first", "last_ns": "last"})
        return _times(frame, ("first", "last"))

    def series(self, metrics: str | Sequence[str], max_points: int = 0, **window: Any) -> pd.DataFrame:
        """One row per bucket: host, gpu, pid, metric, bucket_start, min, avg, max, count."""
        request = query_pb2.SeriesRequest(
            window=make_window(**window), metrics=_as_list(metrics), max_points=max_points
        )
        answer = self._call("Series", request)
        parts = [
            pd.DataFrame(
                {
                    "host": s.host,
                    "gpu": s.gpu,
                    "pid": s.pid,
                    "metric": s.metric,
                    "bucket_start": np.array(s.bucket_start, dtype=np.int64),
                    "min": np.array(s.min),
                    "avg": np.array(s.avg),
                    "max": np.array(s.max),
                    "count": np.array(s.count, dtype=np.uint64),
                }
            )
            for s in answer.series
        ]
        columns = ["host", "gpu", "pid", "metric", "bucket_start", "min", "avg", "max", "count"]
        frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
        frame.attrs["bucket_ns"] = answer.bucket_ns
        return _times(frame, ("bucket_start",))

    def event_pages(
        self, kinds: Sequence[str] = (), names: Sequence[str] = (), page_size: int = 0, **window: Any
    ) -> Iterator[pd.DataFrame]:
        """Every page of events overlapping the window, in (start, id) order."""
        request = query_pb2.EventsRequest(
            window=make_window(**window), kinds=_as_list(kinds), names=_as_list(names), page_size=page_size
        )
        while True:
            answer = self._call("Events", request)
            yield _events_frame(answer)
            if not answer.next_page_token:
                return
            request.page_token = answer.next_page_token

    def events(
        self,
        kinds: Sequence[str] = (),
        names: Sequence[str] = (),
        limit: int | None = None,
        page_size: int = 0,
        **window: Any,
    ) -> pd.DataFrame:
        """Events overlapping the window, up to `limit` rows (None: all)."""
        frames: list[pd.DataFrame] = []
        count = 0
        for page in self.event_pages(kinds, names, page_size or min(limit or 10_000, 100_000), **window):
            frames.append(page)
            count += len(page)
            if limit is not None and count >= limit:
                break
        frame = pd.concat(frames, ignore_index=True)
        return frame if limit is None else frame.head(limit)

    def lanes(self, kinds: Sequence[str] = (), buckets: int = 0, **window: Any) -> pd.DataFrame:
        """Per lane and time bucket: events, busy_ns, top_name (cut where top_name_cut); attrs hold the grid
        (start_ns, bucket_ns, buckets), the number of events in the window, and whether the answer's bytes
        left rows out (truncated)."""
        request = query_pb2.LanesRequest(window=make_window(**window), kinds=_as_list(kinds), buckets=buckets)
        answer = self._call("Lanes", request)
        frame = frame_of(answer.lanes) if answer.lanes.arrow_ipc else pd.DataFrame(columns=LANE_COLUMNS)
        frame.attrs.update(
            start_ns=answer.start_ns, bucket_ns=answer.bucket_ns, buckets=answer.buckets, events=answer.events,
            truncated=answer.lanes.truncated,
        )  # fmt: skip
        return frame

    def summary(self, kind: str, limit: int = 0, **window: Any) -> pd.DataFrame:
        """nsys-stats style summary: kind is kernels, api, memops or nvtx. A name longer than the server
        shows is cut, ending in …, with name_cut set; attrs["truncated"]: the answer's bytes left rows out."""
        answer = self._call("Summary", query_pb2.SummaryRequest(window=make_window(**window), kind=kind, limit=limit))
        frame = frame_of(answer)
        frame.attrs["truncated"] = answer.truncated
        return frame

    def gpu_time(self, min_gap_ns: int = 0, max_gaps: int = 0, **window: Any) -> dict[str, pd.DataFrame]:
        """{"gpus": busy/idle per GPU, "gaps": the `max_gaps` longest idle gaps longer than min_gap_ns,
        longest first}; gaps.attrs["gap_count"]: how many such gaps there are in all."""
        request = query_pb2.GpuTimeRequest(window=make_window(**window), min_gap_ns=min_gap_ns, max_gaps=max_gaps)
        answer = self._call("GpuTime", request)
        gaps = frame_of(answer.gaps)
        gaps.attrs["gap_count"] = answer.gap_count
        return {"gpus": frame_of(answer.gpus), "gaps": gaps}

    def nvtx_gpu(self, limit: int = 0, **window: Any) -> dict[str, pd.DataFrame]:
        """{"summary": per range name, "ranges": the first `limit` ranges, each with the GPU work
        launched inside it (none unless limit > 0)}."""
        answer = self._call("NvtxGpu", query_pb2.NvtxGpuRequest(window=make_window(**window), limit=limit))
        return {"summary": frame_of(answer.summary), "ranges": frame_of(answer.ranges)}

    def phases(self, **window: Any) -> pd.DataFrame:
        """Per phase name and GPU: instances, time, GPU busy % and NVML telemetry inside."""
        return arrow_table(self._call("Phases", query_pb2.PhasesRequest(window=make_window(**window)))).to_pandas()

    def launch(self, short_ns: int = 0, **window: Any) -> dict[str, pd.DataFrame]:
        """{"latency": per kernel name, "short_kernels", "idle_after_sync": per GPU}."""
        answer = self._call("Launch", query_pb2.LaunchRequest(window=make_window(**window), short_ns=short_ns))
        return {
            "latency": frame_of(answer.latency),
            "short_kernels": frame_of(answer.short_kernels),
            "idle_after_sync": frame_of(answer.idle_after_sync),
        }

    def diff(self, run_a: str, run_b: str, summaries: Sequence[str] = (), limit: int = 0) -> pd.DataFrame:
        """Kernel, API and memory-operation summaries of two runs side by side, biggest |Δ| first."""
        request = query_pb2.DiffRequest(run_a=run_a, run_b=run_b, summaries=list(summaries), limit=limit)
        return frame_of(self._call("Diff", request))

    def compare(
        self, run_ids: Sequence[str] = (), tags: Mapping[str, str] | None = None, top_kernels: int = 0
    ) -> pd.DataFrame:
        """One row per run: the runs named, in that order, then those carrying every one of
        `tags` (newest first); at most 1000 (attrs["truncated"] says whether more matched).
        Columns: run_id, name, status, exit_code, start, duration_s, gpus, energy_j,
        gpu_util_mean, gpu_util_p95, sm_active_mean, proc_sm_util_mean, gpu_mem_peak_bytes,
        busy_pct, kernels, top_kernels (short names, each with its share), top_kernels_full (the same,
        names whole), then `tag.<key>` per tag key (sorted)."""
        request = query_pb2.CompareRequest(run_ids=list(run_ids), tags=dict(tags or {}), top_kernels=top_kernels)
        answer = self._call("Compare", request)
        frame = _times(frame_of(answer), ("start",))
        frame.attrs["truncated"] = answer.truncated
        return frame

    def verdict(
        self,
        a: Sequence[str] | Mapping[str, str],
        b: Sequence[str] | Mapping[str, str],
        measures: Sequence[str] = (),
        skip: int | None = None,
        step_pattern: str = "",
        window_ns: int = 0,
        min_effect: float = 0.0,
    ) -> dict[str, pd.DataFrame]:
        """Is B faster than A: each a list of runs (ids or names) or a mapping of tags that select
        its runs. {"measures": per measure a, b, change (b/a - 1), low, high (95 % interval), verdict,
        more_runs, ...; "parts": the step-time difference in parts that add up to it, ns per step;
        "phases": the same difference by phase (the ranges inside the steps, and the time outside them);
        "phase_work": the GPU time launched from each phase, per step;
        "runs": per run its group, where its steps came from, warm-up dropped, steps kept};
        frames["measures"].attrs["notes"]: what was left out and why."""
        request = query_pb2.VerdictRequest(
            a=_run_group(a), b=_run_group(b), measures=list(measures), step_pattern=step_pattern,
            window_ns=window_ns, min_effect=min_effect,
        )  # fmt: skip
        if skip is not None:
            request.skip = skip
        answer = self._call("Verdict", request)
        frames = {
            name: frame_of(getattr(answer, name)) for name in ("measures", "parts", "phases", "phase_work", "runs")
        }
        frames["measures"].attrs["notes"] = list(answer.notes)
        return frames

    def sql_arrow(self, sql: str, max_rows: int = 0) -> tuple[pa.Table, bool]:
        """Read-only SQL; returns the result and whether it was truncated at max_rows."""
        answer = self._call("Sql", query_pb2.SqlRequest(sql=sql, max_rows=max_rows))
        return arrow_table(answer), answer.truncated

    def sql(self, sql: str, max_rows: int = 0) -> pd.DataFrame:
        table, truncated = self.sql_arrow(sql, max_rows)
        frame = to_frame(table)
        frame.attrs["truncated"] = truncated
        return frame

    # -- captures on demand (the Capture service) ----------------------------------------------

    def capture(
        self, run: str, steps: int = 0, seconds: float = 0.0, ranks: Sequence[int] = (), reason: str = ""
    ) -> dict[str, Any]:
        """Ask the processes of a running training run (its id or name) to profile `steps` steps (default
        10), or the steps that begin within `seconds`, into the run; returns the request (`capture_list`'s
        shape). Needs a token that may write the run."""
        request = capture_pb2.CaptureRequest(run_id=run, steps=steps, seconds=seconds, ranks=ranks, reason=reason)
        return capture_dict(self._call("Request", request, self._captures))

    def capture_list(self, run: str = "", limit: int = 0) -> list[dict[str, Any]]:
        """The latest capture requests (of one run, by id), newest first, each with its state (asked,
        under way, done, expired) and per process its outcome; times in ns, sizes in bytes."""
        answer = self._call("List", capture_pb2.CaptureListRequest(run_id=run, limit=limit), self._captures)
        return [capture_dict(state) for state in answer.captures]

    def capture_state(self, request_id: str, run: str) -> dict[str, Any]:
        """One request, as `capture` answered it, now; needs the same token as asking (write)."""
        request = capture_pb2.CaptureStateRequest(request_id=request_id, run_id=run)
        return capture_dict(self._call("State", request, self._captures))


def _events_frame(answer: query_pb2.EventsResponse) -> pd.DataFrame:
    columns = answer.events
    strings = np.array(answer.dictionary, dtype=object)

    def text(codes: Sequence[int]) -> Any:
        return strings[np.array(codes, dtype=np.int64)] if len(codes) else np.array([], dtype=object)

    extras: list[dict[str, str]] = [{} for _ in range(len(columns.start))]
    for row, key, value in zip(columns.extra_row, columns.extra_key, columns.extra_value, strict=True):
        extras[row][answer.dictionary[key]] = answer.dictionary[value]
    frame = pd.DataFrame(
        {
            "run_id": text(columns.run),
            "host": text(columns.host),
            "kind": text(columns.kind),
            "start": np.array(columns.start, dtype=np.int64),
            "end": np.array(columns.end, dtype=np.int64),
            "gpu": np.array(columns.gpu, dtype=np.int16),
            "stream": np.array(columns.stream, dtype=np.int32),
            "pid": np.array(columns.pid, dtype=np.uint32),
            "tid": np.array(columns.tid, dtype=np.uint64),
            "name": text(columns.name),
            "correlation_id": np.array(columns.correlation_id, dtype=np.uint64),
            "bytes": np.array(columns.bytes, dtype=np.uint64),
            "depth": np.array(columns.depth, dtype=np.uint16),
            "extras": extras,
            "id": np.array(columns.id, dtype=np.uint64),
            "launch_start": pd.array(
                [None if v < 0 else v for v in columns.launch_start] or [None] * len(columns.start),
                dtype="Int64",
            ),
        }
    )
    frame.insert(5, "duration_ns", frame["end"] - frame["start"])
    return _times(frame, EVENT_TIME_COLUMNS)


def _run_group(group: Sequence[str] | Mapping[str, str]) -> query_pb2.RunGroup:
    if isinstance(group, Mapping):
        return query_pb2.RunGroup(tags=dict(group))
    if isinstance(group, str):
        return query_pb2.RunGroup(run_ids=[group])
    return query_pb2.RunGroup(run_ids=list(group))
