"""Check a Batch against the data model and turn it into Arrow tables for the store.

Pure: no I/O. A batch is accepted whole or refused whole with a BatchError that names the
field and the reason.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from store.eventids import event_ids
from tracehouse.model import (
    EVENT_KINDS,
    MAX_EVENT_BYTES,
    MAX_EVENT_NS,
    MAX_TIME_NS,
    NO_GPU,
    NO_STREAM,
    RUN_SOURCES,
    Limits,
)
from tracehouse.v1 import batch_pb2, ingest_pb2

BATCH_ID = re.compile(r"[A-Za-z0-9._:/-]+")
TIMESTAMP = pa.timestamp("ns", tz="UTC")
STRING_MAP = pa.map_(pa.string(), pa.string())


class BatchError(ValueError):
    """A batch that breaks the data model; `field` names where."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class ValidatedBatch:
    batch_id: str
    digest: str  # of the batch as sent, less unknown fields: a batch_id re-used for other content is told apart
    samples: pa.Table | None
    events: pa.Table | None
    runs: pa.Table | None
    devices: pa.Table | None

    def rows(self) -> dict[str, int]:
        return {
            "samples": _rows(self.samples),
            "events": _rows(self.events),
            "runs": _rows(self.runs),
            "devices": _rows(self.devices),
        }


def _rows(table: pa.Table | None) -> int:
    return 0 if table is None else table.num_rows


def validate_batch(
    batch: batch_pb2.Batch, limits: Limits, received_ns: int, encoded: bytes = b"", namespace: str = ""
) -> ValidatedBatch:
    """`encoded`: the WriteRequest as it arrived, when it has no unknown fields (for the digest);
    without it, the batch is encoded again. `namespace` goes before the batch id as the ledger and
    the event ids know it: the writer's own (tracehouse.scopes.Grant.namespace), so that one writer's
    batch ids never meet another's."""
    check_id("batch.batch_id", batch.batch_id, limits)
    strings = _Strings(batch.dictionary, limits)
    batch_id = namespace + batch.batch_id
    validated = ValidatedBatch(
        batch_id=batch_id,
        digest=_digest(encoded or canonical_request(batch)),
        samples=_samples(batch, strings, limits) if batch.HasField("samples") else None,
        events=_events(batch, batch_id, strings, limits) if batch.HasField("events") else None,
        runs=_runs(batch.runs, limits, received_ns) if batch.runs else None,
        devices=_devices(batch.devices, limits, received_ns) if batch.devices else None,
    )
    if not any(validated.rows().values()):
        raise BatchError("batch", "has no samples, events, runs or devices")
    return validated


def canonical_request(batch: batch_pb2.Batch) -> bytes:
    """The WriteRequest of `batch` as tracehouse encodes it, without fields this server does not
    know (it clears them): the bytes a sender of the same rows sends, less what it adds."""
    batch.DiscardUnknownFields()
    return ingest_pb2.WriteRequest(batch=batch).SerializeToString(deterministic=True)


def has_unknown_fields(message: Message) -> bool:
    """Whether `message` or a message in it carries fields this server does not know."""
    if len(UnknownFieldSet(message)):
        return True
    for descriptor, value in message.ListFields():
        kind = descriptor.message_type
        if kind is None or kind.GetOptions().map_entry:
            continue
        if any(has_unknown_fields(item) for item in (value if descriptor.is_repeated else (value,))):
            return True
    return False


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def check_id(field: str, value: str, limits: Limits) -> None:
    if not value:
        raise BatchError(field, "required")
    if len(value) > limits.max_id_bytes or not BATCH_ID.fullmatch(value):
        raise BatchError(field, f"must be 1..{limits.max_id_bytes} characters of [A-Za-z0-9._:/-]")


def _check_text(field: str, value: str, limit: int) -> None:
    # a str of n characters takes at most 4n bytes in UTF-8
    if len(value) * 4 > limit and len(value.encode()) > limit:
        raise BatchError(field, f"{len(value.encode())} bytes; the limit is {limit}")


class _Strings:
    """The batch's dictionary, checked once, turned into Arrow once."""

    def __init__(self, dictionary: Sequence[str], limits: Limits) -> None:
        if len(dictionary) > limits.max_dictionary_entries:
            raise BatchError(
                "batch.dictionary", f"{len(dictionary)} strings; the limit is {limits.max_dictionary_entries}"
            )
        first: dict[str, int] = {}
        for i, text in enumerate(dictionary):
            _check_text(f"batch.dictionary[{i}]", text, limits.max_string_bytes)
            seen = first.setdefault(text, i)
            if seen != i:  # the store's columns are Arrow dictionaries, which hold each string once
                raise BatchError(f"batch.dictionary[{i}]", f"repeats entry {seen}; each string may appear once")
        self.values = dictionary
        self._arrow: pa.Array | None = None

    @property
    def arrow(self) -> pa.Array:
        if self._arrow is None:
            self._arrow = pa.array(self.values, pa.string())
        return self._arrow

    def codes(self, field: str, column: Sequence[int], rows: int) -> npt.NDArray[np.int32]:
        codes = np.array(column, dtype=np.uint32)
        if codes.size != rows:
            raise BatchError(field, f"{codes.size} values for {rows} rows")
        if rows and int(codes.max()) >= len(self.values):
            bad = int(np.flatnonzero(codes >= len(self.values))[0])
            raise BatchError(
                f"{field}[{bad}]",
                f"index {codes[bad]} is outside the dictionary ({len(self.values)} strings)",
            )
        return codes.astype(np.int32)

    def used(self, codes: npt.NDArray[np.int32]) -> list[tuple[int, str]]:
        if not codes.size:
            return []
        present = np.flatnonzero(np.bincount(codes, minlength=len(self.values)))
        return [(int(i), self.values[int(i)]) for i in present]

    def column(self, codes: npt.NDArray[np.int32]) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), self.arrow)


def _required_rows(table: str, columns: Any, names: Sequence[str]) -> int:
    lengths = {name: len(getattr(columns, name)) for name in names}
    rows = lengths[names[0]]
    for name, length in lengths.items():
        if length != rows:
            raise BatchError(f"{table}.{name}", f"{length} values for {rows} rows (the length of {names[0]})")
    return rows


def _optional(field: str, column: Sequence[int], rows: int, default: int, dtype: npt.DTypeLike) -> npt.NDArray[Any]:
    if len(column) == 0:
        return np.full(rows, default, dtype=dtype)
    if len(column) != rows:
        raise BatchError(field, f"{len(column)} values for {rows} rows (give one per row, or none)")
    return np.array(column, dtype=dtype)


def _times(field: str, column: Sequence[int]) -> npt.NDArray[np.int64]:
    times = np.array(column, dtype=np.int64)
    if times.size and (times.min() < 0 or times.max() >= MAX_TIME_NS):
        bad = int(np.flatnonzero((times < 0) | (times >= MAX_TIME_NS))[0])
        _check_time(f"{field}[{bad}]", int(times[bad]))
    return times


def _check_time(field: str, ns: int) -> None:
    if ns < 0:
        raise BatchError(field, f"{ns} is before 1970; times are ns since the Unix epoch")
    if ns >= MAX_TIME_NS:
        raise BatchError(field, f"{ns} is after 2200; times are ns since the Unix epoch")


def _check_no_rows(table: str, columns: Any) -> None:
    for descriptor, values in columns.ListFields():
        raise BatchError(f"{table}.{descriptor.name}", f"{len(values)} values for 0 rows")


def _check_months(field: str, times: npt.NDArray[np.int64], limits: Limits) -> None:
    """The store partitions by month; a batch over too many months cannot be inserted whole."""
    if times.size and int(times.max() - times.min()) > (limits.max_months_per_batch - 2) * 28 * 86_400 * 10**9:
        months = np.unique(times.astype("datetime64[ns]").astype("datetime64[M]")).size
        if months > limits.max_months_per_batch:
            raise BatchError(field, f"spans {months} months; one batch may span {limits.max_months_per_batch}")


def _check_rows(table: str, rows: int, limits: Limits) -> None:
    if rows > limits.max_rows_per_table:
        raise BatchError(table, f"{rows} rows; the limit is {limits.max_rows_per_table} per batch")


def _gpus(field: str, column: Sequence[int], rows: int, limits: Limits) -> npt.NDArray[np.int16]:
    gpus = _optional(field, column, rows, NO_GPU, np.int32)
    if rows and (gpus.min() < NO_GPU or gpus.max() > limits.max_gpu_index):
        bad = int(np.flatnonzero((gpus < NO_GPU) | (gpus > limits.max_gpu_index))[0])
        raise BatchError(f"{field}[{bad}]", f"{gpus[bad]} is not a GPU index (-1 or 0..{limits.max_gpu_index})")
    return gpus.astype(np.int16)


def _run_and_host(
    table: str, batch: batch_pb2.Batch, columns: Any, strings: _Strings, rows: int, limits: Limits
) -> tuple[pa.Array, pa.Array]:
    out = []
    for column, default, check in (("run", batch.run_id, "id"), ("host", batch.host, "name")):
        field = f"{table}.{column}"
        if len(getattr(columns, column)) == 0:
            if not default:
                raise BatchError(field, f"empty, and batch.{'run_id' if column == 'run' else 'host'} is not set")
            values = [default]
            codes = np.zeros(rows, dtype=np.int32)
            dictionary = pa.array(values, pa.string())
            array = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), dictionary)
        else:
            codes = strings.codes(field, getattr(columns, column), rows)
            values = [text for _, text in strings.used(codes)]
            array = strings.column(codes)
        for text in values:
            if check == "id":
                check_id(field, text, limits)
            else:
                _check_name(field, text, limits)
                _check_printable(field, text)
        out.append(array)
    return out[0], out[1]


def _check_name(field: str, text: str, limits: Limits) -> None:
    if not text:
        raise BatchError(field, "must not be empty")
    _check_text(field, text, limits.max_name_bytes)


def _check_printable(field: str, host: str) -> None:
    """A host name shown in tables, logs and capture requests: no control characters."""
    if not host.isprintable():
        raise BatchError(field, f"{host[:64]!r} holds control characters")


def _samples(batch: batch_pb2.Batch, strings: _Strings, limits: Limits) -> pa.Table | None:
    columns = batch.samples
    rows = _required_rows("samples", columns, ("ts", "metric", "value"))
    if rows == 0:
        _check_no_rows("samples", columns)
        return None
    _check_rows("samples", rows, limits)
    ts = _times("samples.ts", columns.ts)
    _check_months("samples.ts", ts, limits)
    values = np.array(columns.value, dtype=np.float64)
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise BatchError(f"samples.value[{bad}]", f"{values[bad]} is not a finite number")
    metric = strings.codes("samples.metric", columns.metric, rows)
    for _, text in strings.used(metric):
        _check_name("samples.metric", text, limits)
    run, host = _run_and_host("samples", batch, columns, strings, rows, limits)
    return pa.table(
        {
            "run_id": run,
            "host": host,
            "gpu": _gpus("samples.gpu", columns.gpu, rows, limits),
            "pid": _optional("samples.pid", columns.pid, rows, 0, np.uint32),
            "metric": strings.column(metric),
            "ts": pa.array(ts, TIMESTAMP),
            "value": values,
        }
    )


def _events(batch: batch_pb2.Batch, batch_id: str, strings: _Strings, limits: Limits) -> pa.Table | None:
    columns = batch.events
    rows = _required_rows("events", columns, ("start", "end", "kind", "name"))
    if rows == 0:
        _check_no_rows("events", columns)
        return None
    _check_rows("events", rows, limits)
    if len(columns.id):
        raise BatchError("events.id", "is set by the server; leave it empty")
    start = _times("events.start", columns.start)
    end = _times("events.end", columns.end)
    _check_months("events.start", start, limits)
    backwards = end < start
    if backwards.any():
        bad = int(np.flatnonzero(backwards)[0])
        raise BatchError(
            f"events.end[{bad}]",
            f"{end[bad]} is before start {start[bad]} ({int(backwards.sum())} such rows)",
        )
    too_long = end - start > MAX_EVENT_NS
    if too_long.any():
        bad = int(np.flatnonzero(too_long)[0])
        raise BatchError(
            f"events.end[{bad}]",
            f"the event lasts {end[bad] - start[bad]} ns; the limit is {MAX_EVENT_NS} (366 days)",
        )
    kind = strings.codes("events.kind", columns.kind, rows)
    for _, text in strings.used(kind):
        if text not in EVENT_KINDS:
            raise BatchError("events.kind", f"unknown kind {text[:64]!r}; known: {', '.join(EVENT_KINDS)}")
    name = strings.codes("events.name", columns.name, rows)
    run, host = _run_and_host("events", batch, columns, strings, rows, limits)
    return pa.table(
        {
            "run_id": run,
            "host": host,
            "kind": strings.column(kind),
            "start": pa.array(start, TIMESTAMP),
            "end": pa.array(end, TIMESTAMP),
            "gpu": _gpus("events.gpu", columns.gpu, rows, limits),
            "stream": _optional("events.stream", columns.stream, rows, NO_STREAM, np.int32),
            "pid": _optional("events.pid", columns.pid, rows, 0, np.uint32),
            "tid": _optional("events.tid", columns.tid, rows, 0, np.uint64),
            "name": strings.column(name),
            "correlation_id": _optional("events.correlation_id", columns.correlation_id, rows, 0, np.uint64),
            "bytes": _bytes(columns.bytes, rows),
            "depth": _depths(columns.depth, rows),
            "extras": _extras(columns, strings, rows, limits),
            "id": event_ids(batch_id, rows),
            "launch_start": _launch_starts(columns.launch_start, rows),
        }
    )


def _launch_starts(column: Sequence[int], rows: int) -> pa.Array:
    starts = _optional("events.launch_start", column, rows, -1, np.int64)
    if rows and starts.min() < -1:
        bad = int(np.flatnonzero(starts < -1)[0])
        raise BatchError(f"events.launch_start[{bad}]", f"{starts[bad]} is before 1970 (-1 means unknown)")
    if rows and starts.max() >= MAX_TIME_NS:
        bad = int(np.flatnonzero(starts >= MAX_TIME_NS)[0])
        _check_time(f"events.launch_start[{bad}]", int(starts[bad]))
    return pa.array(starts, TIMESTAMP, mask=starts == -1)


def _bytes(column: Sequence[int], rows: int) -> npt.NDArray[np.uint64]:
    moved = _optional("events.bytes", column, rows, 0, np.uint64)
    if rows and moved.max() > MAX_EVENT_BYTES:
        bad = int(np.flatnonzero(moved > MAX_EVENT_BYTES)[0])
        raise BatchError(f"events.bytes[{bad}]", f"{moved[bad]} is more than {MAX_EVENT_BYTES} (1 PiB)")
    return moved


def _depths(column: Sequence[int], rows: int) -> npt.NDArray[np.uint16]:
    depth = _optional("events.depth", column, rows, 0, np.uint32)
    if rows and depth.max() > np.iinfo(np.uint16).max:
        bad = int(np.flatnonzero(depth > np.iinfo(np.uint16).max)[0])
        raise BatchError(f"events.depth[{bad}]", f"{depth[bad]} is deeper than 65535")
    return depth.astype(np.uint16)


def _extras(columns: batch_pb2.EventColumns, strings: _Strings, rows: int, limits: Limits) -> pa.Array:
    count = _required_rows("events", columns, ("extra_row", "extra_key", "extra_value"))
    offsets = np.zeros(rows + 1, dtype=np.int32)
    if count == 0:  # keys and values as the batch's dictionary, as below: every batch's extras of one type
        none = strings.column(np.zeros(0, np.int32))
        return pa.MapArray.from_arrays(offsets, none, none)
    row = np.array(columns.extra_row, dtype=np.uint32)
    if int(row.max()) >= rows:
        bad = int(np.flatnonzero(row >= rows)[0])
        raise BatchError(f"events.extra_row[{bad}]", f"row {row[bad]} does not exist ({rows} rows)")
    key = strings.codes("events.extra_key", columns.extra_key, count)
    value = strings.codes("events.extra_value", columns.extra_value, count)
    for _, text in strings.used(key):
        _check_name("events.extra_key", text, limits)
    order = np.argsort(row, kind="stable")
    per_row = np.bincount(row, minlength=rows)
    if per_row.max() > limits.max_map_entries:
        bad = int(np.argmax(per_row))
        raise BatchError(
            "events.extra_row", f"row {bad} has {per_row[bad]} extras; the limit is {limits.max_map_entries}"
        )
    offsets[1:] = np.cumsum(per_row)
    # codes into the batch's dictionary, as the string columns are: the engine reads them as the strings, and
    # no string is copied here (taken, they cost 0.07 µs an event of an Nsight export's, and the insert 0.04 more)
    return pa.MapArray.from_arrays(offsets, strings.column(key[order]), strings.column(value[order]))


def _string_map(field: str, mapping: Mapping[str, str], limits: Limits) -> list[tuple[str, str]]:
    if len(mapping) > limits.max_map_entries:
        raise BatchError(field, f"{len(mapping)} entries; the limit is {limits.max_map_entries}")
    for key, value in mapping.items():
        _check_name(f"{field} key", key, limits)
        _check_text(f"{field}[{key[:64]!r}]", value, limits.max_string_bytes)
    return sorted(mapping.items())


def _runs(runs: Sequence[batch_pb2.Run], limits: Limits, received_ns: int) -> pa.Table:
    if len(runs) > limits.max_runs_per_batch:
        raise BatchError("batch.runs", f"{len(runs)} runs; the limit is {limits.max_runs_per_batch}")
    for i, run in enumerate(runs):
        field = f"runs[{i}]"
        check_id(f"{field}.run_id", run.run_id, limits)
        if run.source not in RUN_SOURCES:
            raise BatchError(f"{field}.source", f"{run.source[:64]!r} is not one of {', '.join(RUN_SOURCES)}")
        _check_text(f"{field}.name", run.name, limits.max_string_bytes)
        _check_text(f"{field}.host", run.host, limits.max_name_bytes)
        _check_printable(f"{field}.host", run.host)
        _check_time(f"{field}.start", run.start)
        if run.HasField("end"):
            _check_time(f"{field}.end", run.end)
            if run.end < run.start:
                raise BatchError(f"{field}.end", f"{run.end} is before start {run.start}")
    return pa.table(
        {
            "run_id": [r.run_id for r in runs],
            "name": [r.name for r in runs],
            "host": [r.host for r in runs],
            "source": [r.source for r in runs],
            "start": pa.array([r.start for r in runs], TIMESTAMP),
            "end": pa.array([r.end if r.HasField("end") else None for r in runs], TIMESTAMP),
            "relative_time": [r.relative_time for r in runs],
            "tags": pa.array([_string_map(f"runs[{i}].tags", r.tags, limits) for i, r in enumerate(runs)], STRING_MAP),
            "attrs": pa.array(
                [_string_map(f"runs[{i}].attrs", r.attrs, limits) for i, r in enumerate(runs)], STRING_MAP
            ),
            "importing": [r.importing for r in runs],
            "updated": pa.array([received_ns] * len(runs), TIMESTAMP),
        }
    )


def _devices(devices: Sequence[batch_pb2.Device], limits: Limits, received_ns: int) -> pa.Table:
    if len(devices) > limits.max_devices_per_batch:
        raise BatchError("batch.devices", f"{len(devices)} devices; the limit is {limits.max_devices_per_batch}")
    for i, device in enumerate(devices):
        field = f"devices[{i}]"
        _check_name(f"{field}.host", device.host, limits)
        _check_printable(f"{field}.host", device.host)
        if not 0 <= device.gpu <= limits.max_gpu_index:
            raise BatchError(f"{field}.gpu", f"{device.gpu} is not a GPU index (0..{limits.max_gpu_index})")
        for name in ("uuid", "name", "driver", "pci_bus_id"):
            _check_text(f"{field}.{name}", getattr(device, name), limits.max_name_bytes)
        if device.run_id:
            check_id(f"{field}.run_id", device.run_id, limits)
    return pa.table(
        {
            "host": [d.host for d in devices],
            "gpu": pa.array([d.gpu for d in devices], pa.int16()),
            "uuid": [d.uuid for d in devices],
            "name": [d.name for d in devices],
            "memory_total": pa.array([d.memory_total for d in devices], pa.uint64()),
            "sm_count": pa.array([d.sm_count for d in devices], pa.uint32()),
            "driver": [d.driver for d in devices],
            "pci_bus_id": [d.pci_bus_id for d in devices],
            "run_id": [d.run_id for d in devices],
            "attrs": pa.array(
                [_string_map(f"devices[{i}].attrs", d.attrs, limits) for i, d in enumerate(devices)],
                STRING_MAP,
            ),
            "updated": pa.array([received_ns] * len(devices), TIMESTAMP),
        }
    )
