"""Import an Nsight Systems export: read it in chunks, ship a batch per chunk, and make the
run visible only once everything else is stored.

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent.gpu import describe_device
from agent.nsys import Export, Session, Source
from tracehouse.batch import BatchBuilder
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
    events: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    devices: int = 0
    relative_time: bool = False
    seconds: float = 0.0

    def json(self) -> str:
        return json.dumps(self.__dict__)


def run_id_of(session: Session, host: str) -> str:
    return "nsys-" + hashlib.sha256(f"{session.digest}/{host}".encode()).hexdigest()[:24]


def _describe(description: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:12]


def import_export(
    path: Path,
    sink: BatchSink,
    run_name: str = "",
    host: str = "",
    tags: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> ImportResult:
    """Raises NsysError for a file that cannot be imported; nothing of it becomes visible."""
    started = time.monotonic()
    with Export(path) as export:
        session = export.session
        host = host or session.host or "unknown"
        run_id = run_id_of(session, host)
        result = ImportResult(file=str(path), run_id=run_id, relative_time=session.start_ns is None)
        run: dict[str, Any] = {
            "run_id": run_id,
            "name": run_name or path.stem,
            "host": host,
            "source": "nsys",
            "start": session.offset_ns,
            "relative_time": session.start_ns is None,
            "tags": dict(tags or {}),
            "attrs": _attrs(path, session),
        }
        version = _describe(run)
        sink.write(BatchBuilder(f"{run_id}/run/{version}/begin").add_run(**run, importing=True).build())
        end = session.offset_ns
        threads: set[tuple[int, int]] = set()
        for source in export.sources():
            end = max(end, _ship_source(export, source, run_id, host, sink, result, threads, progress))
        for number, chunk in enumerate(export.metric_chunks()):
            builder = BatchBuilder(f"{run_id}/gpu_metrics/{number:06d}", run_id=run_id, host=host)
            builder.add_samples(chunk.column("metric"), chunk.column("ts").to_numpy(),
                                chunk.column("value").to_numpy(), gpu=chunk.column("gpu").to_numpy())  # fmt: skip
            sink.write(builder.build())
            result.samples += chunk.num_rows
        names = _names(export, run_id, host, threads, session.offset_ns, result)
        if names is not None:
            sink.write(names)
        export.check_unchanged()
        sink.flush()  # everything else is stored before the run becomes visible
        run["attrs"] = {**run["attrs"], **{f"events.{k}": str(v) for k, v in sorted(result.events.items())}}
        final = BatchBuilder(f"{run_id}/run/{version}/end").add_run(**run, end=end, importing=False)
        sink.write(final.build())
        sink.flush()
    result.seconds = round(time.monotonic() - started, 3)
    return result


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


def _ship_source(
    export: Export,
    source: Source,
    run_id: str,
    host: str,
    sink: BatchSink,
    result: ImportResult,
    threads: set[tuple[int, int]],
    progress: Progress | None,
) -> int:
    """Ship one source's chunks; returns the latest end seen."""
    expected = export.estimated_rows(source) if progress else 0
    done = 0
    end = 0
    for number, chunk in enumerate(prefetched(export.chunks(source))):
        builder = BatchBuilder(f"{run_id}/{source.name}/{number:06d}", run_id=run_id, host=host)
        sink.write(builder.add_event_table(chunk).build())
        kinds = pc.value_counts(chunk.column("kind"))
        for kind, count in zip(kinds.field("values").to_pylist(), kinds.field("counts").to_pylist(), strict=True):
            result.events[kind] = result.events.get(kind, 0) + count
        end = max(end, pc.max(chunk.column("end")).as_py())
        if "pid" in chunk.schema.names and "tid" in chunk.schema.names:
            pid_tid = np.unique(chunk.column("pid").to_numpy() * (1 << 24) + chunk.column("tid").to_numpy())
            threads.update((int(v) >> 24, int(v) & 0xFFFFFF) for v in pid_tid)
        done += chunk.num_rows
        if progress:
            progress(source.name, done, max(done, expected))
    return end


_DONE = object()


def prefetched(chunks: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Read the next chunks in a thread of their own while this one encodes and sends: the
    SQLite reader and Arrow work without the GIL, so the two overlap on two cores."""
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def read() -> None:
        try:
            for chunk in chunks:
                while not stop.is_set():
                    try:
                        ready.put(chunk, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put(_DONE)
        except BaseException as error:  # handed to the consumer, raised there
            ready.put(error)

    thread = threading.Thread(target=read, name="nsys-reader", daemon=True)
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
    export: Export, run_id: str, host: str, threads: set[tuple[int, int]], at: int, result: ImportResult
) -> batch_pb2.Batch | None:
    """GPUs, and names of the processes and threads that own events; None when there are none."""
    builder = BatchBuilder(f"{run_id}/names", run_id=run_id, host=host)
    for gpu in export.session.gpus:
        describe_device(builder, host, run_id, gpu)
        result.devices += 1
    threads = {(pid, tid) for pid, tid in threads if pid or tid}
    processes = export.process_names({pid for pid, _ in threads})
    thread_names = export.thread_names(threads)
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
    return builder.build() if rows or export.session.gpus else None
