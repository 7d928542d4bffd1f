"""Import a trace file: read it in chunks, ship a batch per chunk, and make the run visible
only once everything else is stored.

Two formats, told by content (agent/traces/tracefile.py): Nsight Systems SQLite exports (agent/traces/nsys.py)
and PyTorch-profiler Kineto traces (agent/traces/kineto.py). Both are a `Trace` to this module: the
run, its batches and when it becomes visible are decided here, the same way for both.

The run id comes from the file's content (and the host it is filed under), batch ids from
(run, source, chunk): importing a file again stores nothing new, and an interrupted import
is finished by running it again.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent.telemetry.gpu import DeviceInfo, describe_device
from agent.traces.kineto import KinetoTrace
from agent.traces.nsys import Export, Session, Source
from agent.traces.tracefile import Part, Trace, TraceFileError, sniff
from tracehouse.batch import BatchBuilder
from tracehouse.model import GPU_WORK
from tracehouse.v1 import batch_pb2

Progress = Callable[[str, int, int], None]  # (source, rows done, rows expected)
T = TypeVar("T")


class BatchSink(Protocol):
    def write(self, batch: batch_pb2.Batch) -> None: ...

    def flush(self) -> None: ...


@dataclass
class ImportResult:
    file: str
    run_id: str
    host: str = ""  # the host the run is filed under
    events: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    devices: int = 0
    relative_time: bool = False
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)  # read but not imported, per reason
    attrs: dict[str, str] = field(default_factory=dict)  # the run's: the source's facts and the counts
    end_ns: int = 0

    def json(self) -> str:
        return json.dumps({k: v for k, v in self.__dict__.items() if k != "attrs"})


def run_id_of(trace: Trace, host: str) -> str:
    return f"{trace.source}-" + hashlib.sha256(f"{trace.digest}/{host}".encode()).hexdigest()[:24]


def filed_under(trace: Trace, host: str) -> tuple[str, str]:
    """(run id, host key) of a trace: filed under `host` (the caller's), else the host the trace names,
    else under a host key of its own, its run id: a trace that names no host (most Kineto traces, old
    nsys exports) says nothing of where it ran, so its GPUs are its own, never the importing machine's
    nor another host-less trace's. Its run id is then the same wherever it is imported."""
    named = host or trace.host
    if named:
        return run_id_of(trace, named), named
    run_id = run_id_of(trace, "")
    return run_id, run_id


def _describe(description: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:12]


def import_export(
    path: Path,
    sink: BatchSink,
    run_name: str = "",
    host: str = "",
    tags: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    default_host: str = "",
    into_run: str = "",
    job: Callable[[Mapping[str, str]], Mapping[str, str]] | None = None,
) -> ImportResult:
    """Import an nsys export or a Kineto trace, told apart by content. Raises TraceFileError
    (NsysError, KinetoError) for a file that cannot be imported; nothing of it becomes visible.
    The run is filed under `host`, else the host the file names, else a host key of its own
    (filed_under). `default_host` is not used: the importing machine is not where a trace that names
    no host ran. `into_run`: the rows go to this run, which the caller describes (its description then
    says whether the import finished); no run rows are written. `job`: the job attrs of the run, made
    from the trace's own (tracehouse.jobs.import_membership)."""
    del default_host
    started = time.monotonic()
    with open_trace(path) as trace:
        filed_id, host = filed_under(trace, host)
        run_id = into_run or filed_id
        host = run_id if host == filed_id else host  # a host-less trace's rows go under the run they go to
        result = ImportResult(file=str(path), run_id=run_id, host=host, relative_time=trace.relative_time)
        run: dict[str, Any] = {
            "run_id": run_id,
            "name": run_name or trace.default_name(),
            "host": host,
            "source": trace.source,
            "start": trace.start_ns,
            "relative_time": trace.relative_time,
            "tags": dict(tags or {}),
            "attrs": _hostless(trace.attrs(), host, run_id),
        }
        filed_attrs = dict(run["attrs"])
        if job is not None:
            result.attrs = dict(job(run["attrs"]))
            run["attrs"].update(result.attrs)
        version = _describe(run)
        if not into_run:
            # The begin describes the file, whatever the caller names, tags and files in a job: importing a
            # finished file again under a new name or --job re-sends the very begin it stored (a duplicate,
            # never taken for sending the run back to importing), and the end renames the run.
            as_filed = {**run, "name": trace.default_name(), "tags": {}, "attrs": filed_attrs}
            begin = BatchBuilder(f"{run_id}/run/{_describe(as_filed)}/begin").add_run(**as_filed, importing=True)
            sink = _Declaring(sink, begin.build())
        try:
            _ship(trace, run, run_id, host, sink, result, progress, into_run, version)
        except TraceFileError as error:
            if isinstance(sink, _Declaring) and sink.declared:  # refused mid-import: the run says why
                failed = {**run, "attrs": {**run["attrs"], "import_failed": str(error)[:4096]}}
                sink.write(BatchBuilder(f"{run_id}/run/{version}/failed").add_run(**failed, importing=True).build())
                sink.flush()
            raise
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _ship(
    trace: Trace,
    run: dict[str, Any],
    run_id: str,
    host: str,
    sink: BatchSink,
    result: ImportResult,
    progress: Progress | None,
    into_run: str,
    version: str,
) -> None:
    """Everything of the run, then (unless `into_run`) the description that makes it visible."""
    end = trace.start_ns
    threads: set[tuple[int, int]] = set()
    touched: set[int] = set()  # the GPUs its work or samples are on
    for part in trace.parts():
        end = max(end, _ship_part(part, run_id, host, sink, result, threads, progress, touched))
    for number, chunk in enumerate(trace.sample_chunks()):
        builder = BatchBuilder(f"{run_id}/gpu_metrics/{number:06d}", run_id=run_id, host=host)
        builder.add_samples(chunk.column("metric"), chunk.column("ts").to_numpy(),
                            chunk.column("value").to_numpy(), gpu=chunk.column("gpu").to_numpy())  # fmt: skip
        sink.write(builder.build())
        result.samples += chunk.num_rows
        touched.update(gpu for gpu in pc.unique(chunk.column("gpu")).to_pylist() if gpu is not None and gpu >= 0)
    names = _names(trace, run_id, host, threads, trace.start_ns, result)
    if names is not None:
        sink.write(names)
    trace.check_unchanged()
    sink.flush()  # everything else is stored before the run becomes visible
    result.skipped = trace.skipped()
    run["start"] = trace.start_ns  # a Kineto trace's earliest event is known once it is read
    run["attrs"] = {
        **result.attrs,  # the caller's (a job's), set before the import
        **_hostless(trace.attrs(), host, run_id),
        **_gpus(len(trace.devices()), touched),
        **{f"events.{k}": str(v) for k, v in sorted(result.events.items())},
        **{f"skipped.{k}": str(v) for k, v in result.skipped.items()},
    }
    result.attrs = run["attrs"]
    result.end_ns = max(end, trace.start_ns)
    if not into_run:
        final = BatchBuilder(f"{run_id}/run/{version}/end")
        final.add_run(**run, end=result.end_ns, importing=False)
        sink.write(final.build())
        sink.flush()


HOSTLESS_ATTR = "host"  # in a host-less trace's attrs: why its host key is its run id
HOSTLESS_TEXT = "none named in the trace: filed under its run id"


def _hostless(attrs: dict[str, str], host: str, run_id: str) -> dict[str, str]:
    return {**attrs, HOSTLESS_ATTR: HOSTLESS_TEXT} if host == run_id else attrs


def _gpus(described: int, touched: set[int]) -> dict[str, str]:
    """The run's GPUs (attr `gpus`, query/rungpus.py): those its work or telemetry touched, not every GPU
    the trace describes (Kineto's deviceProperties lists all of the host's), which `gpus_described` counts."""
    return {"gpus": str(len(touched)), "gpus_described": str(described)}


def _attrs(path: Path, session: Session) -> dict[str, str]:
    attrs = {
        "file": path.name,
        "file_bytes": str(session.size),
        "sha256": session.digest,
        "nsys_version": session.nsys_version or "unknown",
        "gpus": str(len(session.gpus)),
    }
    if session.schema_version:
        attrs["nsys_schema_version"] = session.schema_version
    if session.command:
        attrs["command"] = session.command[:4096]
    if session.start_ns is None:
        attrs["time"] = f"relative to the session start, shifted by {session.offset_ns} ns"
    return attrs


class _Declaring:
    """A sink that declares the run (importing, so that none of it is in any answer) just before
    the first batch of its rows, and waits until that is stored: a file refused while its first
    chunk is read (all of a small Kineto trace is read by then) leaves nothing stored."""

    def __init__(self, sink: BatchSink, begin: batch_pb2.Batch) -> None:
        self._sink = sink
        self._begin: batch_pb2.Batch | None = begin

    @property
    def declared(self) -> bool:
        return self._begin is None

    def write(self, batch: batch_pb2.Batch) -> None:
        if self._begin is not None:
            self._sink.write(self._begin)
            self._sink.flush()
            self._begin = None
        self._sink.write(batch)

    def flush(self) -> None:
        self._sink.flush()


def _ship_part(
    part: Part,
    run_id: str,
    host: str,
    sink: BatchSink,
    result: ImportResult,
    threads: set[tuple[int, int]],
    progress: Progress | None,
    touched: set[int],
) -> int:
    """Ship one part's chunks; returns the latest end seen. Adds the GPUs its GPU work ran on to `touched`."""
    done = 0
    end = 0
    for number, chunk in enumerate(prefetched(part.chunks) if part.read_ahead else part.chunks):
        builder = BatchBuilder(f"{run_id}/{part.name}/{number:06d}", run_id=run_id, host=host)
        sink.write(builder.add_event_table(chunk).build())
        kinds = pc.value_counts(chunk.column("kind"))
        for kind, count in zip(kinds.field("values").to_pylist(), kinds.field("counts").to_pylist(), strict=True):
            result.events[kind] = result.events.get(kind, 0) + count
        end = max(end, pc.max(chunk.column("end")).as_py())
        if "gpu" in chunk.schema.names:
            work = pc.filter(chunk.column("gpu"), pc.is_in(chunk.column("kind").cast(pa.string()), pa.array(GPU_WORK)))
            touched.update(gpu for gpu in pc.unique(work).to_pylist() if gpu is not None and gpu >= 0)
        if "pid" in chunk.schema.names and "tid" in chunk.schema.names:
            pid_tid = np.unique(chunk.column("pid").to_numpy() * (1 << 24) + chunk.column("tid").to_numpy())
            threads.update((int(v) >> 24, int(v) & 0xFFFFFF) for v in pid_tid)
        done += chunk.num_rows
        if progress:
            progress(part.name, done, max(done, part.estimate(done)))
    return end


_DONE = object()


def prefetched(chunks: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Read the next chunks in a thread of their own while this one encodes and sends: the
    SQLite reader and Arrow work without the GIL, so the two overlap on two cores."""
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: Any) -> bool:
        """Hand `item` over, unless the consumer stopped meanwhile (then no one takes it: a blocking
        put would hold this thread, and the consumer's join, for good)."""
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for chunk in chunks:
                if not offer(chunk):
                    return
            offer(_DONE)
        except BaseException as error:  # handed to the consumer, raised there
            offer(error)

    thread = threading.Thread(target=read, name="trace-reader", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _names(
    trace: Trace, run_id: str, host: str, threads: set[tuple[int, int]], at: int, result: ImportResult
) -> batch_pb2.Batch | None:
    """GPUs, and names of the processes and threads that own events; None when there are none."""
    builder = BatchBuilder(f"{run_id}/names", run_id=run_id, host=host)
    gpus = trace.devices()
    for gpu in gpus:
        describe_device(builder, host, run_id, gpu)
        result.devices += 1
    threads = {(pid, tid) for pid, tid in threads if pid or tid}
    processes = trace.process_names({pid for pid, _ in threads})
    thread_names = trace.thread_names(threads)
    rows: list[dict[str, Any]] = [
        {"kind": "process", "name": name, "pid": pid, "tid": 0} for pid, name in sorted(processes.items())
    ] + [{"kind": "thread", "name": name, "pid": pid, "tid": tid} for (pid, tid), name in sorted(thread_names.items())]
    if rows:
        table = pa.table(
            {
                "kind": [r["kind"] for r in rows],
                "start": pa.array([at] * len(rows), pa.int64()),
                "end": pa.array([at] * len(rows), pa.int64()),
                "name": [r["name"] for r in rows],
                "pid": pa.array([r["pid"] for r in rows], pa.int64()),
                "tid": pa.array([r["tid"] for r in rows], pa.int64()),
            }
        )
        builder.add_event_table(table)
    return builder.build() if rows or gpus else None


def open_trace(path: Path) -> Trace:
    """The file as a Trace, by its content: a SQLite file is an nsys export, JSON (plain or
    gzip) a Kineto trace. Raises TraceFileError."""
    if sniff(path) == "kineto":
        return KinetoTrace(path)
    return NsysTrace(path)


class NsysTrace:
    """An nsys export (agent/traces/nsys.py Export) as a Trace."""

    source = "nsys"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.export = Export(path)
        session = self.export.session
        self.digest = session.digest
        self.host = session.host
        self.start_ns = session.offset_ns
        self.relative_time = session.start_ns is None

    def __enter__(self) -> NsysTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.export.close()

    def default_name(self) -> str:
        return self.path.stem

    def attrs(self) -> dict[str, str]:
        attrs = _attrs(self.path, self.export.session)
        if self.export.replaced_utf8:
            attrs["utf8"] = "invalid UTF-8 replaced with U+FFFD"
        return attrs

    def parts(self) -> Iterator[Part]:
        for source in self.export.sources():
            yield Part(source.name, self.export.chunks(source), _estimate(self.export, source))

    def sample_chunks(self) -> Iterator[pa.RecordBatch]:
        return self.export.metric_chunks()

    def devices(self) -> Sequence[DeviceInfo]:
        return self.export.session.gpus

    def process_names(self, pids: set[int]) -> dict[int, str]:
        return self.export.process_names(pids)

    def thread_names(self, threads: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
        return self.export.thread_names(threads)

    def skipped(self) -> dict[str, int]:
        return {}

    def check_unchanged(self) -> None:
        self.export.check_unchanged()


def _estimate(export: Export, source: Source) -> Callable[[int], int]:
    """The rows a source has, asked of the export on the first call only (a progress bar's)."""
    known: list[int] = []

    def estimate(_done: int) -> int:
        if not known:
            known.append(export.estimated_rows(source))
        return known[0]

    return estimate
