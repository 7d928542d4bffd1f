"""Build columnar `Batch` messages from arrays: the sender's side of the wire protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import Message

from tracehouse import packed
from tracehouse.model import NO_GPU, NO_STREAM
from tracehouse.v1 import batch_pb2, ingest_pb2

ArrayLike = npt.ArrayLike
_REQUEST_BATCH = ingest_pb2.WriteRequest.DESCRIPTOR.fields_by_name["batch"].number

# optional event columns and the value a row takes when it has none
EVENT_OPTIONAL_COLUMNS = {
    "gpu": NO_GPU,
    "stream": NO_STREAM,
    "pid": 0,
    "tid": 0,
    "correlation_id": 0,
    "bytes": 0,
    "depth": 0,
    "launch_start": -1,
}


def encode_request(batch: batch_pb2.Batch) -> bytes:
    """A WriteRequest as bytes. The server tells a re-sent batch from another batch that
    re-uses its id by a hash of these bytes, so maps are encoded in a fixed order."""
    # the batch is its only field: framed, not copied into a WriteRequest (half what encoding cost)
    return packed.length_delimited(_REQUEST_BATCH, batch.SerializeToString(deterministic=True))


def as_ns(values: ArrayLike, column: str) -> npt.NDArray[np.int64]:
    """Timestamps as int64 ns; floats must be finite and whole. Raises ValueError naming the column."""
    array = np.asarray(values)
    if array.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(array))
        if bad.size:
            raise ValueError(f"{column}[{bad[0]}]: {array[bad[0]]} is not a time (NaN or infinite)")
        if np.any(array != np.floor(array)):
            raise ValueError(f"{column}: times are integer nanoseconds; got fractions")
    elif array.dtype.kind == "M":
        array = array.astype("datetime64[ns]").view(np.int64)
    elif array.size and array.dtype.kind not in "iu":
        raise ValueError(f"{column}: times are integer nanoseconds, not {array.dtype}")
    return array.astype(np.int64, copy=False)


@dataclass
class _Dictionary:
    strings: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def code(self, value: str) -> int:
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.strings)
            self.strings.append(value)
        return found

    def codes_of(self, array: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint32]:
        """Codes of a string (or dictionary) array: the encoding runs in Arrow and numpy, only
        the distinct strings used pass through Python."""
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if not pa.types.is_dictionary(array.type):
            array = pc.dictionary_encode(array)
        indices = array.indices.to_numpy(zero_copy_only=False)
        if not indices.size:
            return np.zeros(0, np.uint32)
        if len(array.dictionary) <= 4 * indices.size:  # counted, not sorted: a tenth of np.unique's time
            used = np.flatnonzero(np.bincount(indices))
            rank = np.zeros(used[-1] + 1, np.intp)
            rank[used] = np.arange(used.size)
            position = rank[indices]
        else:  # a dictionary far larger than the rows (an export's whole string table): memory as the rows
            used, position = np.unique(indices, return_inverse=True)
        table = np.fromiter((self.code(s) for s in array.dictionary.take(used).to_pylist()), np.uint32)
        return table[position]

    def codes(self, values: str | Sequence[str], rows: int) -> list[int]:
        if isinstance(values, str):
            return [self.code(values)] * rows
        if len(values) != rows:
            raise ValueError(f"{len(values)} strings for {rows} rows")
        return [self.code(v) for v in values]


class BatchBuilder:
    """Accumulates rows for one batch; `build()` returns the message.

    String columns take one string (every row) or one per row.
    """

    def __init__(self, batch_id: str, run_id: str = "", host: str = "") -> None:
        self._dictionary = _Dictionary()
        self._batch = batch_pb2.Batch(batch_id=batch_id, run_id=run_id, host=host)

    @property
    def sample_rows(self) -> int:
        return len(self._batch.samples.ts)

    @property
    def event_rows(self) -> int:
        return len(self._batch.events.start)

    def add_samples(
        self,
        metric: str | Sequence[str] | pa.Array,
        ts: ArrayLike,
        value: ArrayLike,
        gpu: int | ArrayLike | None = None,
        pid: int | ArrayLike | None = None,
    ) -> BatchBuilder:
        times = as_ns(ts, "samples.ts")
        values = np.asarray(value, dtype=np.float64)
        rows = times.size
        if values.size != rows:
            raise ValueError(f"samples.value: {values.size} values for {rows} timestamps")
        columns = self._batch.samples
        _fill_optional(columns, "gpu", len(columns.ts), rows, gpu, NO_GPU)
        _fill_optional(columns, "pid", len(columns.ts), rows, pid, 0)
        packed.extend(columns, "ts", times)
        packed.extend(columns, "value", values)
        if isinstance(metric, pa.Array | pa.ChunkedArray):
            packed.extend(columns, "metric", self._dictionary.codes_of(metric))
        else:
            packed.extend(columns, "metric", np.array(self._dictionary.codes(metric, rows), np.uint32))
        return self

    def add_events(
        self,
        kind: str | Sequence[str],
        start: ArrayLike,
        end: ArrayLike,
        name: str | Sequence[str],
        extras: Sequence[Mapping[str, str]] | None = None,
        **optional: int | ArrayLike,
    ) -> BatchBuilder:
        """Optional columns by keyword: gpu, stream, pid, tid, correlation_id, bytes, depth."""
        starts = as_ns(start, "events.start")
        ends = as_ns(end, "events.end")
        rows = starts.size
        if ends.size != rows:
            raise ValueError(f"events.end: {ends.size} values for {rows} starts")
        unknown = set(optional) - set(EVENT_OPTIONAL_COLUMNS)
        if unknown:
            raise ValueError(f"events: unknown columns {sorted(unknown)}")
        columns = self._batch.events
        first_row = len(columns.start)
        for column, default in EVENT_OPTIONAL_COLUMNS.items():
            _fill_optional(columns, column, first_row, rows, optional.get(column), default)
        packed.extend(columns, "start", starts)
        packed.extend(columns, "end", ends)
        packed.extend(columns, "kind", np.array(self._dictionary.codes(kind, rows), np.uint32))
        packed.extend(columns, "name", np.array(self._dictionary.codes(name, rows), np.uint32))
        if extras is not None:
            if len(extras) != rows:
                raise ValueError(f"events.extras: {len(extras)} maps for {rows} rows")
            for offset, mapping in enumerate(extras):
                for key, val in mapping.items():
                    columns.extra_row.append(first_row + offset)
                    columns.extra_key.append(self._dictionary.code(key))
                    columns.extra_value.append(self._dictionary.code(val))
        return self

    def add_event_table(self, table: pa.RecordBatch | pa.Table) -> BatchBuilder:
        """Rows of events from Arrow: columns kind, start, end, name, any optional event
        column, and extras as string columns named `x:KEY` (an empty string: no extra)."""
        rows = table.num_rows
        columns = self._batch.events
        first_row = len(columns.start)
        names = set(table.column_names)
        for column, default in EVENT_OPTIONAL_COLUMNS.items():
            values = table.column(column).to_numpy() if column in names else None
            if values is not None and not len(getattr(columns, column)) and (values == default).all():
                values = None  # every row so far has the default: the column stays empty
            _fill_optional(columns, column, first_row, rows, values, default)
        packed.extend(columns, "start", as_ns(table.column("start").to_numpy(), "events.start"))
        packed.extend(columns, "end", as_ns(table.column("end").to_numpy(), "events.end"))
        packed.extend(columns, "kind", self._dictionary.codes_of(table.column("kind")))
        packed.extend(columns, "name", self._dictionary.codes_of(table.column("name")))
        for column in table.column_names:
            if not column.startswith("x:"):
                continue
            values = table.column(column)
            if pa.types.is_dictionary(values.type):
                present = np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))
            else:
                present = np.flatnonzero(pc.not_equal(values, "").to_numpy(zero_copy_only=False))
            if present.size:
                key = self._dictionary.code(column[2:])
                packed.extend(columns, "extra_row", present + first_row)
                packed.extend(columns, "extra_key", np.full(present.size, key, np.uint32))
                packed.extend(columns, "extra_value", self._dictionary.codes_of(values.take(present)))
        return self

    def add_run(
        self,
        run_id: str,
        *,
        name: str = "",
        host: str = "",
        source: str = "user",
        start: int = 0,
        end: int | None = None,
        relative_time: bool = False,
        tags: Mapping[str, str] | None = None,
        attrs: Mapping[str, str] | None = None,
        importing: bool = False,
    ) -> BatchBuilder:
        run = self._batch.runs.add(
            run_id=run_id,
            name=name,
            host=host,
            source=source,
            start=start,
            relative_time=relative_time,
            importing=importing,
        )
        if end is not None:
            run.end = end
        run.tags.update(tags or {})
        run.attrs.update(attrs or {})
        return self

    def add_device(self, host: str, gpu: int, **fields: object) -> BatchBuilder:
        attrs = fields.pop("attrs", None)
        device = self._batch.devices.add(host=host, gpu=gpu, **fields)
        if isinstance(attrs, Mapping):
            device.attrs.update(attrs)
        return self

    def build(self) -> batch_pb2.Batch:
        del self._batch.dictionary[:]
        self._batch.dictionary.extend(self._dictionary.strings)
        return self._batch


def _fill_optional(
    columns: Message, column: str, rows_before: int, rows: int, values: int | ArrayLike | None, default: int
) -> None:
    """Append `rows` values to an optional column, keeping it empty while no row has one
    and back-filling the default once one does."""
    held = len(getattr(columns, column))
    if values is None:
        if held:
            packed.extend(columns, column, np.full(rows, default))
        return
    if held < rows_before:
        packed.extend(columns, column, np.full(rows_before - held, default))
    packed.extend(columns, column, np.broadcast_to(np.asarray(values), (rows,)))
