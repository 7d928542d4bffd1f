"""Packed columns from numpy (tracehouse/packed.py): the same bytes as protobuf's own encoder makes
of the same values, and the same refusals, so that a batch's digest does not depend on which filled it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracehouse import packed
from tracehouse.batch import BatchBuilder, encode_request
from tracehouse.v1 import batch_pb2, ingest_pb2

EDGES = {  # field -> values at the edges of what each varint width and type holds
    "kind": [0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**32 - 1],
    "gpu": [0, -1, 1, 63, -64, 64, -65, 2**31 - 1, -(2**31), 8191, -8193],
    "tid": [0, 1, 2**35, 2**49 - 1, 2**56, 2**63, 2**64 - 1, 300],
    "id": [0, 1, 2**63, 2**64 - 1],
    "start": [0, -1, 2**63 - 1, -(2**63), 1_790_000_000_123_456_789],
}


@pytest.mark.parametrize("field", sorted(EDGES))
def test_edge_values_encode_as_protobuf_encodes_them(field: str) -> None:
    dtype = np.uint64 if field in ("tid", "id", "kind") else np.int64
    values = np.array(EDGES[field], dtype=dtype)
    ours, theirs = batch_pb2.EventColumns(), batch_pb2.EventColumns()
    packed.extend(ours, field, values)
    getattr(theirs, field).extend(values.tolist())
    assert ours.SerializeToString() == theirs.SerializeToString()
    assert list(getattr(ours, field)) == EDGES[field]


def test_random_columns_of_every_type_encode_as_protobuf_encodes_them() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        rows = int(rng.integers(1, 3000))
        columns = {
            "ts": rng.integers(-(2**62), 2**62, rows),
            "metric": rng.integers(0, 2 ** int(rng.integers(1, 32)), rows, dtype=np.uint64),
            "value": rng.normal(size=rows) * 10.0 ** rng.integers(-300, 300, rows),
            "gpu": rng.integers(-(2**31), 2**31, rows),
            "pid": rng.integers(0, 2**32, rows, dtype=np.uint64),
        }
        ours, theirs = batch_pb2.SampleColumns(), batch_pb2.SampleColumns()
        for field, values in columns.items():
            packed.extend(ours, field, values)
            packed.extend(ours, field, values[: rows // 2])  # appends, as extend does
            getattr(theirs, field).extend(values.tolist() + values[: rows // 2].tolist())
        assert ours.SerializeToString() == theirs.SerializeToString()


def test_values_a_field_cannot_hold_are_refused_naming_it() -> None:
    columns = batch_pb2.EventColumns()
    with pytest.raises(ValueError, match=r"kind: value -1 is out of range"):
        packed.extend(columns, "kind", np.array([3, -1]))
    with pytest.raises(ValueError, match=r"gpu: value 2147483648 is out of range"):
        packed.extend(columns, "gpu", np.array([2**31]))
    with pytest.raises(ValueError, match=r"pid: value 4294967296 is out of range"):
        packed.extend(columns, "pid", np.array([2**32], np.uint64))
    with pytest.raises(TypeError, match=r"start: float64 values for an integer field"):
        packed.extend(columns, "start", np.array([1.5]))
    assert columns.SerializeToString() == b""  # nothing of a refused column was added


def test_an_empty_column_marks_its_message_present_as_extend_does() -> None:
    batch = batch_pb2.Batch()
    packed.extend(batch.events, "start", np.zeros(0, np.int64))
    assert batch.HasField("events")


def test_a_batch_built_from_arrow_encodes_as_one_filled_value_by_value() -> None:
    """The builder's columns, optional ones back-filled and extras included, as protobuf makes them."""
    first = pa.table({
        "kind": ["kernel", "kernel"], "start": [10, 20], "end": [15, 20], "name": ["gemm", "relu"],
        "gpu": pa.array([-1, -1], pa.int16()), "x:grid": ["1x1x1", ""],
    })  # fmt: skip
    second = pa.table({
        "kind": ["memcpy"], "start": [30], "end": [40], "name": ["[CUDA memcpy]"],
        "gpu": pa.array([1], pa.int16()), "tid": pa.array([2**40], pa.uint64()), "bytes": pa.array([4096], pa.uint64()),
    })  # fmt: skip
    built = BatchBuilder("b/1", run_id="r", host="h").add_event_table(first).add_event_table(second)
    built.add_samples("gpu.util", [5, 6], [0.5, 1.0], gpu=[-1, 3])
    expected = batch_pb2.Batch(batch_id="b/1", run_id="r", host="h")
    expected.dictionary.extend(["kernel", "gemm", "relu", "grid", "1x1x1", "memcpy", "[CUDA memcpy]", "gpu.util"])
    events = expected.events
    events.kind.extend([0, 0, 5])
    events.start.extend([10, 20, 30])
    events.end.extend([15, 20, 40])
    events.name.extend([1, 2, 6])
    events.gpu.extend([-1, -1, 1])  # the default in the first table: the column stayed empty, then back-filled
    events.tid.extend([0, 0, 2**40])
    events.bytes.extend([0, 0, 4096])
    events.extra_row.append(0)
    events.extra_key.append(3)
    events.extra_value.append(4)
    expected.samples.ts.extend([5, 6])
    expected.samples.metric.extend([7, 7])
    expected.samples.value.extend([0.5, 1.0])
    expected.samples.gpu.extend([-1, 3])
    assert encode_request(built.build()) == encode_request(expected)


def test_a_request_is_its_batch_framed_as_protobuf_frames_it() -> None:
    """encode_request frames the batch's bytes instead of copying it into a WriteRequest: the same
    bytes, maps in their fixed order included, so digests and the ledger are unchanged."""
    built = BatchBuilder("b/2", run_id="r", host="h").add_run("r", name="run", host="h", start=5)
    built.add_device("h", 0, name="GPU", attrs={"z": "1", "a": "2", "m": "3"})
    built.add_samples("gpu.util", np.arange(300), np.linspace(0, 1, 300), gpu=np.zeros(300, np.int16))
    for batch in (built.build(), batch_pb2.Batch(), batch_pb2.Batch(batch_id="x" * 200)):
        assert encode_request(batch) == ingest_pb2.WriteRequest(batch=batch).SerializeToString(deterministic=True)


@pytest.mark.parametrize("unused", [0, 1000])  # a dictionary about the rows' size, and one far larger
def test_strings_of_a_dictionary_array_are_coded_in_the_order_of_its_dictionary(unused: int) -> None:
    """Codes of a slice of a dictionary array whose dictionary holds strings no row uses: only the
    strings used enter the batch, in the order of the dictionary, as before."""
    dictionary = pa.array(["unused", "relu", "gemm", "also unused", "copy", *(f"more {i}" for i in range(unused))])
    array = pa.DictionaryArray.from_arrays(pa.array([4, 0, 2, 1, 2, 4, 3], pa.int32()), dictionary).slice(2, 4)
    table = pa.table({"kind": pa.array(["kernel"] * 4), "start": [1, 2, 3, 4], "end": [1, 2, 3, 4], "name": array})
    batch = BatchBuilder("b/3").add_event_table(table).build()
    assert list(batch.dictionary) == ["kernel", "relu", "gemm", "copy"]
    assert [batch.dictionary[code] for code in batch.events.name] == ["gemm", "relu", "gemm", "copy"]
