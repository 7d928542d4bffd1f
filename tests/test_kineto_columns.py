"""The column-wise mapping of Kineto events (agent/traces/kineto_columns.py) against the per-event
one (kineto_events.EventRows), which it must match row for row: random blocks of events that mix
every type a member can have (floats near a half, Decimals, ints, strings as ids, absent values,
items that are not objects), with small chunks so that windows meet chunk ends."""

from __future__ import annotations

import gc
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from agent.traces import kineto_blocks, kineto_columns, kineto_events
from agent.traces.kineto import KinetoTrace
from agent.traces.kineto_blocks import Event
from agent.traces.kineto_chunk import Chunk
from agent.traces.kineto_columns import ColumnRows
from agent.traces.kineto_events import CATEGORIES, EventRows, to_ns
from agent.traces.kineto_plan import ns_column
from agent.traces.kineto_synthetic import KinetoSpec, write_trace
from tests.conftest import FIXTURES

BASE_NS = 1_790_000_000_000_000_000
KINETO = FIXTURES / "kineto"
REAL = sorted(KINETO.glob("*.json.gz")) if KINETO.is_dir() else []


def _time(rng: random.Random) -> Any:
    return rng.choice(
        [
            lambda: round(rng.uniform(0, 5e6), 3),  # the usual: µs with ns decimals
            lambda: round(rng.uniform(0, 5e6), 3) + 0.0005,  # near a half ns
            lambda: float(f"{rng.randrange(10**6)}.{rng.randrange(10**4):04d}5"),
            lambda: Decimal(f"{rng.randrange(10**15)}.{rng.randrange(1000):03d}"),
            lambda: rng.randrange(10**7),
            lambda: rng.choice([2**60, -(2**60), 2**70, -5, -5.5, 0, 0.0, 1e17, 4.4e15, 9007199254740.993]),
            lambda: rng.choice([None, "12", True, [1], {"a": 1}, Decimal("1e400"), Decimal("-0.0005")]),
        ]
    )()


def _duration(rng: random.Random) -> Any:
    if rng.random() < 0.7:
        return rng.choice([round(rng.uniform(0, 500), 3), rng.randrange(50), 1.5, 0.0015, 2.0005])
    return rng.choice([None, -1, -0.001, 3.2e10, 3.1e10, Decimal("12.3455"), "7", False, 2**64])


def _id(rng: random.Random) -> Any:
    if rng.random() < 0.8:
        return rng.choice([4242, 4243, 0, 7, 1, 2])
    return rng.choice([None, -3, -(2**31), 2**32, 2**40, 2**63, 2**70, "Stream 7", 1.0, Decimal("2"), True])


def _args(rng: random.Random, correlations: list[int]) -> Any:
    if rng.random() < 0.05:
        return rng.choice([None, [1, 2], 5, "args"])
    args: dict[str, Any] = {}
    pool: dict[str, list[Any]] = {
        "device": [0, 1, 0, 4095, 4096, -1, -2, None, "0", 1.0, 2**70],
        "stream": [7, 7, 0, 2**31, -1, None, "7"],
        "correlation": [*correlations, *correlations, 0, -4, 2**64, None, "9"],
        "grid": [[64, 1, 1], [1, 2], [1, 2, "3"], None],
        "block": [[256, 1, 1], [32, 4, 1], 5],
        "registers per thread": [32, None, 1.5],
        "shared memory": [0, 4096, "x"],
        "est. achieved occupancy %": [50, 12.5, Decimal("33.3333333333333333"), "high", None],
        "bytes": [1 << 20, 0, -1, 2**70, 3.0],
        "In msg nelems": [1024, None, -1],
        "Out msg nelems": [2048, 2**70],
        "dtype": ["Float", "BFloat16", "Nope", 4],
        "cuda_sync_kind": ["Event Sync", "", None],
        "name": ["python3", "thread 7", None, 5],
    }
    for key, values in pool.items():
        if rng.random() < 0.4:
            args[key] = rng.choice(values)
    return args


NAMES = [
    "aten::linear", "ProfilerStep#3", "ProfilerStep#", "Memcpy HtoD (Pageable -> Device)", "Memset (Device)",
    "Memcpy ZtoQ (A -> B)", "cudaLaunchKernel_v7000", "cudaDeviceSynchronize", "", "x" * 300, "é" * 40000,
    "process_name", "thread_name", None, 5, Decimal("1.5"),
]  # fmt: skip
PHASES = ["X"] * 12 + ["i", "I", "M", "M", "s", "f", "t", "B", None, 5, ""]


def _event(rng: random.Random, correlations: list[int], unknown: int) -> Any:
    if rng.random() < 0.01:
        return rng.choice([0, 17, -2])  # an item that is not an object
    category = rng.choice([*CATEGORIES, *CATEGORIES, "Trace", f"odd{rng.randrange(unknown)}", None, 3, "ac2g"])
    return Event(
        ph=rng.choice(PHASES),
        cat=category,
        name=rng.choice(NAMES),
        pid=_id(rng),
        tid=_id(rng),
        ts=_time(rng),
        dur=_duration(rng),
        args=_args(rng, correlations),
    )


def _plain(rng: random.Random, correlations: list[int]) -> Event:
    """An event as Kineto writes most of them."""
    category = rng.choice(
        [
            "cpu_op", "cpu_op", "cuda_runtime", "cuda_driver", "kernel", "kernel", "user_annotation", "gpu_memcpy",
            "gpu_memset", "python_function", "gpu_user_annotation", "cuda_sync", "cpu_instant_event",
        ]
    )  # fmt: skip
    gpu = category in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
    args: dict[str, Any] = {}
    if gpu and category != "gpu_user_annotation":
        args = {"device": rng.choice([0, 1]), "stream": 7, "correlation": rng.choice(correlations), "bytes": 64}
    elif category.startswith("cuda_"):
        args = {"correlation": rng.choice(correlations)}
    if category == "kernel":
        args |= {
            "grid": [rng.choice([64, 128]), 1, 1], "block": [256, 1, rng.choice([1, 2])],
            "registers per thread": rng.choice([32, 40]), "shared memory": 0,
            "est. achieved occupancy %": rng.choice([50, 12.5, 100]),
        }  # fmt: skip
        if rng.random() < 0.1:
            args |= {"In msg nelems": 1024, "Out msg nelems": 2048, "dtype": "BFloat16"}
    return Event(
        ph="X",
        cat=category,
        name=rng.choice(NAMES[:8]),
        pid=0 if gpu else 4242,
        tid=7 if gpu else rng.choice([4242, 4243]),
        ts=round(rng.uniform(0, 5e6), 3),
        dur=rng.choice([round(rng.uniform(0, 50), 3), rng.randrange(50)]),
        args=args,
    )


def _map(rows: EventRows, blocks: list[list[Any]]) -> list[list[Any]]:
    """The blocks as kineto.KinetoTrace._chunks takes them (a chunk held until the next is full)."""
    batches: list[pa.RecordBatch] = []
    held: Chunk | None = None
    for block in blocks:
        at = 0
        while at < len(block):
            at = rows.add_all(block, at)
            if len(rows.current) >= kineto_events.CHUNK_ROWS:
                if held is not None:
                    batches.append(rows.release(held))
                held, rows.current = rows.current, Chunk()
    for chunk in (held, rows.current):
        if chunk is not None and len(chunk):
            batches.append(rows.release(chunk))
    return [_readable(batch) for batch in batches]


def _readable(batch: pa.RecordBatch) -> list[Any]:
    columns = []
    for name in sorted(batch.schema.names):
        column = batch.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(pa.string())
        columns.append((name, column.to_pylist()))
    return columns


def _both(blocks: list[list[Any]], offset: int) -> None:
    each, columns = EventRows("t"), ColumnRows("t")
    each.offset = columns.offset = offset
    expected = _map(each, blocks)
    assert _map(columns, blocks) == expected
    assert columns.skipped == each.skipped
    assert (columns.deep_rows, columns.process_names, columns.thread_names) == (
        each.deep_rows,
        each.process_names,
        each.thread_names,
    )


@pytest.mark.parametrize("seed", range(24))
def test_random_blocks_map_as_one_event_at_a_time(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    chunk_rows = rng.choice([40, 300, 2000])
    monkeypatch.setattr(kineto_events, "CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr(kineto_columns, "CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr(kineto_events, "LINK_WINDOW", 2 * chunk_rows)
    monkeypatch.setattr(kineto_columns, "LINK_WINDOW", 2 * chunk_rows)
    correlations = list(range(1, rng.choice([60, 400])))  # more than LINK_WINDOW calls: some are forgotten
    odd = rng.choice([0.0, 0.02, 0.1, 1.0])  # the share of odd events among plain ones
    blocks = []
    for _ in range(rng.randrange(3, 12)):
        size = rng.choice([1, 5, 31, 32, 33, 200, 700])
        blocks.append(
            [
                _event(rng, correlations, unknown=60) if rng.random() < odd else _plain(rng, correlations)
                for _ in range(size)
            ]
        )
    _both(blocks, rng.choice([0, BASE_NS]))


def test_a_block_of_plain_events_is_mapped_column_wise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain events never reach the per-event code; one odd event among them does, in its place."""
    rng = random.Random(7)
    block = [_plain(rng, list(range(1, 40))) for _ in range(400)]
    block[200] = Event(ph="X", cat="cpu_op", name="odd", pid="Stream 7", tid=1, ts=Decimal("1.0015"), dur=1)
    taken: list[Any] = []
    each = EventRows.add_each

    def add_each(self: EventRows, events: list[Any], at: int) -> int:
        taken.extend(events[at:])
        return each(self, events, at)

    monkeypatch.setattr(ColumnRows, "add_each", add_each)
    _both([block], BASE_NS)
    assert taken == [block[200]]


def test_times_are_exact_whatever_their_type() -> None:
    """1.0015 µs is 1001.5 ns, which rounds to 1002 (half to even); 1.0015 * 1000 as a float is
    1001.4999..., which numpy's rounding makes 1001: such values are taken by to_ns, as are
    Decimals and ints beyond int64's ns. Blocks of one type and of mixed types alike."""
    mixed = [1.0015, 1.0005, 2.5, 7, None, "3", Decimal("1.0015"), True, 2**60, 123456.789, 2**64, -3, 1.5e9]
    for values in (mixed, [1.0015, 2.5, None, 0.0005], [7, None, 2**53 + 1, -5, 9 * 10**15], [2**70, 5]):
        ns, proved, absent = ns_column(values, -(10**18), 10**19)
        for value, got, ok, none in zip(values, ns.tolist(), proved.tolist(), absent.tolist(), strict=True):
            exact = to_ns(value)
            assert none == (value is None)
            assert ok == (exact is not None and -(10**18) <= exact <= 10**19), value
            assert got == (exact if ok else 0), value
    assert to_ns(1.0015) == 1002 and to_ns(1.0005) == 1000
    assert ns_column([1.0015, 4.0], 0, 1001)[1].tolist() == [False, False]  # out of [low, high]


def test_gpu_work_on_no_device_or_stream_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device past the last GPU is skipped (counted), one that is not a number or absent is filed
    under the event's pid, a stream past int32 is none: in their place among plain events."""
    rng = random.Random(3)
    block = [_plain(rng, list(range(1, 40))) for _ in range(300)]
    odd = [
        {"device": 4096}, {"device": -1}, {"device": -5}, {"device": "0"}, {"device": None}, {}, {"device": 1.0},
        {"device": 0, "stream": 1 << 31}, {"device": 0, "stream": -1}, {"device": 3, "stream": None}, {"device": 2**64},
    ]  # fmt: skip
    for at, args in zip(range(5, 300, 25), odd, strict=False):
        block[at] = Event(ph="X", cat="kernel", name="k", pid=2, tid=9, ts=10.5 + at, dur=1, args=args)
    _both([block], 0)
    each = EventRows("t")
    each.add_all(block, 0)
    assert each.skipped == {"device out of range": 4}


@pytest.mark.skipif(not REAL, reason=f"no real traces in {KINETO}")
@pytest.mark.parametrize("path", REAL, ids=lambda path: path.name[:40])
def test_real_traces_map_as_one_event_at_a_time(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kineto_events, "CHUNK_ROWS", 5000)  # several chunks, windows cut by their ends
    monkeypatch.setattr(kineto_columns, "CHUNK_ROWS", 5000)
    with KinetoTrace(path) as trace:
        blocks = [trace._primed, *trace._events]
        _both(blocks, trace._rows.offset)


class _Spy:
    """A decoder that says whether the garbage collector ran while it decoded."""

    def __init__(self, decoder: Any, seen: list[bool]) -> None:
        self._decoder, self._seen = decoder, seen

    def decode(self, text: bytes) -> Any:
        self._seen.append(gc.isenabled())
        return self._decoder.decode(text)


def test_blocks_are_parsed_without_collections_and_the_collector_is_left_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.pt.trace.json.gz"
    write_trace(path, KinetoSpec(steps=200))
    seen: list[bool] = []
    fast, generic = kineto_blocks._DECODERS[0]
    monkeypatch.setattr(kineto_blocks, "_DECODERS", ((_Spy(fast, seen), generic), *kineto_blocks._EXACT_DECODERS))
    for enabled in (True, False):
        gc.enable() if enabled else gc.disable()
        try:
            with KinetoTrace(path) as trace:
                assert sum(batch.num_rows for part in trace.parts() for batch in part.chunks)
            assert gc.isenabled() == enabled
        finally:
            gc.enable()
    assert seen and not any(seen)
