"""Fuzzing the boundaries: mutated real trace files through both readers, mutated real batches through the
validator and the real Ingest service. Clean refusal or clean import, never a crash, a traceback or memory
that grows with the input. Over 10,000 cases in all; each part is seeded, so a failure names its case."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.traces.importer import import_export
from ingest.validate import BatchError, validate_batch
from tests.conftest import FIXTURES
from tests.fuzz_worker import Sink
from tests.helpers import T0, request, telemetry, trace
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.v1 import batch_pb2, ingest_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
SEED = os.environ.get("TRACEHOUSE_FUZZ_SEED", "2026-12")
# The whole campaigns run under the `slow` marker (.ci/run runs them after the default suite);
# the default run takes a tenth of each, the same seed, so a regression shows in either.
READER_CASES = {"kineto": 2000, "nsys": 1000}
VALIDATOR_CASES = 6000
SERVICE_CASES = 400
SHORT = 10  # the default run's share: one case in SHORT
CAMPAIGNS = [pytest.param(SHORT, id="short"), pytest.param(1, id="whole", marks=pytest.mark.slow)]
PEAK_RSS_BYTES = 2 << 30
SLOWEST_CASE_S = 10.0

# The smallest real files of each format: cases, not megabytes, are what the fuzzer needs.
READER_FIXTURES = {
    "kineto": [
        "critical_path_cuda_event_sync_event_sync_trace.json.gz",
        "critical_path_simple_add_benchmark_result_493459_1694039959_trace.json.gz",
        "cupti_profiler_benchmark_result_924719_1679055439_trace.json.gz",
    ],
    "nsys": ["nsys-2021.2-mordred-report1.sqlite", "nsys-2026.1-test-cuda.sqlite"],
}
FOLDERS = {"kineto": FIXTURES / "kineto", "nsys": FIXTURES / "nsys"}


@pytest.mark.parametrize("share", CAMPAIGNS)
@pytest.mark.parametrize("kind", sorted(READER_CASES))
def test_mutated_trace_files_are_imported_or_refused_cleanly(kind: str, share: int) -> None:
    cases = READER_CASES[kind] // share
    paths = [FOLDERS[kind] / name for name in READER_FIXTURES[kind]]
    if not all(path.exists() for path in paths):
        pytest.skip(f"the {kind} fixtures are not in {FOLDERS[kind]}")
    finished = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_worker", kind, str(cases), SEED, *map(str, paths)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-6000:] + finished.stdout[-2000:]
    summary = json.loads(finished.stdout.strip().splitlines()[-1])
    assert summary["cases"] == cases
    assert sum(summary["outcomes"].values()) == cases
    assert summary["outcomes"].get("refused", 0) > 0, summary  # the mutations reach the refusals
    assert summary["outcomes"].get("imported", 0) > 0, summary  # and leave some files importable
    assert summary["peak_rss_bytes"] < PEAK_RSS_BYTES, summary
    assert summary["slowest_s"] < SLOWEST_CASE_S, summary


def _real_batches() -> list[batch_pb2.Batch]:
    batches = [telemetry("fuzz-telemetry").build(), trace("fuzz-trace").build()]
    kineto = FIXTURES / "kineto" / READER_FIXTURES["kineto"][2]
    nsys = FIXTURES / "nsys" / READER_FIXTURES["nsys"][0]
    for path in (kineto, nsys):
        if path.exists():
            sink = Sink()
            import_export(path, sink, host="fuzz-host")
            batches.extend(sink.batches)
    return batches


BATCHES = _real_batches()
ENCODED = [batch.SerializeToString() for batch in BATCHES]

INT_VALUES = st.one_of(
    st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 2**64 - 1, T0, 1 << 40]),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
)
FLOAT_VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e308]))
TEXT_VALUES = st.one_of(
    st.text(max_size=40), st.sampled_from(["", "x" * 300, "a b", "../../etc", "\x00", "kernel", "nvtx", "agent"])
)


def _set_repeated(container: Any, values: list[Any]) -> None:
    del container[:]
    container.extend(values)


def _fits(field: Any, value: int) -> int:
    """The value made to fit the field's wire type, as a hostile sender could."""
    bits = {"int32": 32, "sint32": 32, "uint32": 32, "int64": 64, "sint64": 64, "sfixed64": 64,
            "uint64": 64, "fixed64": 64}.get(_type_name(field), 64)  # fmt: skip
    signed = _type_name(field) in ("int32", "sint32", "int64", "sint64", "sfixed64")
    value %= 1 << bits
    if signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _type_name(field: Any) -> str:
    from google.protobuf.descriptor import FieldDescriptor

    names = {v: k.removeprefix("TYPE_").lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
    return names[field.type]


@st.composite
def mutated_batches(draw: st.DrawFn) -> bytes:
    """A real batch, then edits a hostile sender could make: columns of other lengths and values, strings
    anywhere in the dictionary and the descriptions, fields dropped, or bytes flipped on the wire."""
    batch = batch_pb2.Batch()
    batch.CopyFrom(draw(st.sampled_from(BATCHES)))
    for _ in range(draw(st.integers(1, 4))):
        target = draw(st.sampled_from(["samples", "events", "dictionary", "runs", "devices", "ids", "bytes"]))
        if target in ("samples", "events") and batch.HasField(target):
            columns = getattr(batch, target)
            field = draw(st.sampled_from(list(columns.DESCRIPTOR.fields)))
            column = getattr(columns, field.name)
            rows = len(column) or draw(st.integers(0, 3))
            if _type_name(field) == "double":
                values = draw(st.lists(FLOAT_VALUES, min_size=max(0, rows - 1), max_size=rows + 1))
            else:
                values = [_fits(field, v) for v in draw(st.lists(INT_VALUES, min_size=0, max_size=rows + 1))]
                if column and draw(st.booleans()):  # one value changed, the rest as sent
                    values = list(column)
                    values[draw(st.integers(0, len(values) - 1))] = _fits(field, draw(INT_VALUES))
            _set_repeated(column, values)
        elif target == "dictionary" and batch.dictionary:
            at = draw(st.integers(0, len(batch.dictionary) - 1))
            batch.dictionary[at] = draw(st.one_of(TEXT_VALUES, st.sampled_from(list(batch.dictionary))))
            if draw(st.booleans()):
                batch.dictionary.append(draw(TEXT_VALUES))
        elif target == "runs" and batch.runs:
            run = batch.runs[draw(st.integers(0, len(batch.runs) - 1))]
            choice = draw(st.sampled_from(["run_id", "name", "host", "source", "start", "end", "tags", "attrs"]))
            if choice in ("start", "end"):
                setattr(run, choice, _fits(run.DESCRIPTOR.fields_by_name[choice], draw(INT_VALUES)))
            elif choice in ("tags", "attrs"):
                getattr(run, choice)[draw(TEXT_VALUES)] = draw(TEXT_VALUES)
            else:
                setattr(run, choice, draw(TEXT_VALUES))
        elif target == "devices" and batch.devices:
            device = batch.devices[draw(st.integers(0, len(batch.devices) - 1))]
            choice = draw(st.sampled_from(["host", "gpu", "uuid", "memory_total", "sm_count"]))
            if choice in ("host", "uuid"):
                setattr(device, choice, draw(TEXT_VALUES))
            else:
                setattr(device, choice, _fits(device.DESCRIPTOR.fields_by_name[choice], draw(INT_VALUES)))
        elif target == "ids":
            setattr(batch, draw(st.sampled_from(["batch_id", "run_id", "host"])), draw(TEXT_VALUES))
        elif target == "bytes":
            data = bytearray(batch.SerializeToString())
            if data:
                for _ in range(draw(st.integers(1, 8))):
                    data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            return bytes(data)
    return batch.SerializeToString()


def _validate(data: bytes) -> str:
    batch = batch_pb2.Batch()
    try:
        batch.ParseFromString(data)
    except DecodeError:
        return "not a batch"
    try:
        validate_batch(batch, DEFAULT_LIMITS, T0)
    except BatchError as refusal:
        assert refusal.field and refusal.reason and "\n" not in str(refusal), str(refusal)
        return "refused"
    return "valid"


@pytest.mark.parametrize("share", CAMPAIGNS)
def test_mutated_batches_are_validated_or_refused_with_the_field(share: int) -> None:
    outcomes: Counter[str] = Counter()
    cases = VALIDATOR_CASES // share

    @settings(max_examples=cases, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(mutated_batches())
    def validate(data: bytes) -> None:
        outcomes[_validate(data)] += 1

    validate()
    assert outcomes["refused"] > cases // 10 and outcomes["valid"] > cases // 10, outcomes


@pytest.mark.parametrize("share", CAMPAIGNS)
def test_mutated_batches_through_the_ingest_service_never_take_it_down(
    ingest: ingest_pb2_grpc.IngestStub, share: int
) -> None:
    """Through the real server: stored, or refused as INVALID_ARGUMENT (or PERMISSION_DENIED / ALREADY_EXISTS
    for a re-used id); never UNAVAILABLE (a writer would retry it forever), never INTERNAL or UNKNOWN."""
    rng = random.Random(SEED)
    seen: dict[str, int] = {}
    refused_for_content = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS}
    for case in range(SERVICE_CASES // share):
        data = _mutate_one(rng)
        batch = batch_pb2.Batch()
        try:
            batch.ParseFromString(data)
        except DecodeError:
            continue
        batch.batch_id = f"fuzz-{case}" if rng.random() < 0.9 else batch.batch_id
        try:
            ingest.Write(request(batch), timeout=30)
            seen["stored"] = seen.get("stored", 0) + 1
        except grpc.RpcError as error:
            assert error.code() in refused_for_content, f"case {case}: {error.code()}: {error.details()}"
            assert "/tmp" not in (error.details() or ""), error.details()
            seen[error.code().name] = seen.get(error.code().name, 0) + 1
    assert seen.get("stored") and seen.get("INVALID_ARGUMENT"), seen
    ingest.Write(request(telemetry("after-the-fuzz")), timeout=30)  # still up, still storing


def _mutate_one(rng: random.Random) -> bytes:
    """A cheap seeded edit for the service test: one column value of a real batch."""
    batch = batch_pb2.Batch()
    batch.CopyFrom(rng.choice(BATCHES))
    columns = batch.events if batch.HasField("events") else batch.samples
    filled = [f for f in columns.DESCRIPTOR.fields if len(getattr(columns, f.name))]
    if filled:
        field = rng.choice(filled)
        column = getattr(columns, field.name)
        at = rng.randrange(len(column))
        if _type_name(field) == "double":
            column[at] = rng.choice([float("nan"), float("inf"), -1e308, 0.0])
        else:
            column[at] = _fits(field, rng.choice([-1, 0, 2**63 - 1, -(2**63), 2**64 - 1, 1 << 40, T0 * 2]))
    if batch.dictionary and rng.random() < 0.2:
        batch.dictionary.append(rng.choice(batch.dictionary))  # a repeated string
    data = bytearray(batch.SerializeToString())
    if rng.random() < 0.2:
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)
