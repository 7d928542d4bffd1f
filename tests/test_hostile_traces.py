"""Hostile trace files: `tracehouse import` ends each with exit 2 and one line naming the file and
the reason, no traceback, in bounded memory and time linear in the file's size, with nothing in
the store (no run, not even a hidden importing one, and no events). Files that would crash or
exhaust the importer run in a child process under a memory limit (RLIMIT_AS) and a time limit, so
that old code fails the test instead of taking the test runner down."""

from __future__ import annotations

import gzip
import itertools
import logging
import os
import sqlite3
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.shipping.writer import BatchWriter
from agent.traces import nsys_checks
from agent.traces.importer import import_export
from agent.traces.kineto import KinetoTrace
from agent.traces.kineto_synthetic import KinetoSpec, write_trace
from agent.traces.nsys import Export
from agent.traces.nsys_synthetic import Spec, write_export
from agent.traces.tracefile import TraceFileError
from agent.traces.watch import FolderWatcher
from query.client import Client
from tests.fuzz_worker import Sink
from tests.helpers import import_refused

ROOT = Path(__file__).resolve().parents[1]
CHILD_MEMORY = 3 << 30  # address space of the importing child
CHILD_SECONDS = 60
T0_US = 1_790_000_000_000_000  # µs since the epoch (2026)
MAX_TIME_NS = 7_258_118_400 * 10**9 - 1  # tracehouse.model's (2200): times past it are refused or skipped


def nothing_stored(client: Client) -> bool:
    counts = client.sql("SELECT (SELECT count() FROM events) AS e, (SELECT count() FROM runs) AS r").iloc[0]
    return (int(counts["e"]), int(counts["r"])) == (0, 0)


CHILD = (
    "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
    "from tracehouse.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def import_in_child(path: Path, address: str) -> tuple[int, str, float]:
    """`tracehouse import PATH` in a child process under a memory and a time limit: its exit
    status (-9 once past the time limit), stderr and seconds. The limit is set in the child (no
    preexec_fn: a fork of this process, whose gRPC threads run, would log from the child)."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(limit=CHILD_MEMORY), "import", "--server", address, "--host", "h",
             str(path)],
            cwd=ROOT, capture_output=True, text=True, timeout=CHILD_SECONDS,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else ""
        return -9, stderr, time.monotonic() - started
    return done.returncode, done.stderr, time.monotonic() - started


def assert_refused(path: Path, reason: str, address: str, client: Client, seconds: float = 20.0) -> None:
    status, stderr, took = import_in_child(path, address)
    assert status == 2, f"exit {status}: {stderr[-2000:]}"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0] and path.name in lines[0], stderr[-2000:]
    assert took < seconds, f"refused after {took:.1f} s"
    assert nothing_stored(client)


# -- building hostile gzip streams without writing their text -----------------------------------

GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def deflated(head: bytes, block: bytes, repeat: int, tail: bytes, crc: bool = True) -> bytes:
    """A gzip file of `head`, `block` `repeat` times, `tail`: the block is compressed once (after a
    full flush each compressed block is the same bytes), so gigabytes take a second to make. Without
    `crc` the trailer's CRC is left 0 (nothing reads that far)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = packer.compress(head) + packer.flush(zlib.Z_FULL_FLUSH)
    middle = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    last = packer.compress(tail) + packer.flush()
    check = 0
    if crc:
        check = zlib.crc32(head)
        for _ in range(repeat):
            check = zlib.crc32(block, check)
        check = zlib.crc32(tail, check)
    size = len(head) + len(block) * repeat + len(tail)
    return GZIP_HEADER + first + middle * repeat + last + struct.pack("<II", check, size & 0xFFFFFFFF)


def test_the_deflated_builder_makes_valid_gzip() -> None:
    data = deflated(b"[", b"1, " * 1000, 50, b"1]")
    assert gzip.decompress(data) == b"[" + b"1, " * 50_000 + b"1]"


# -- Kineto JSON --------------------------------------------------------------------------------

EVENT = b'{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": '


def _long_number(path: Path) -> None:
    path.write_bytes(b'{"traceEvents": [' + EVENT + b"1" * 100_000 + b', "dur": 1}]}')


def _deep(path: Path) -> None:
    path.write_bytes(b'{"traceEvents": [' + b"[" * 10**6 + b"]" * 10**6 + b"]}")


def _long_string(path: Path) -> None:
    head = b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "name": "'
    path.write_bytes(deflated(head, b"a" * (1 << 20), 1024, b'"}]}'))  # 1 GiB of text in 1 MB


def _zeros(path: Path) -> None:
    path.write_bytes(deflated(b"", bytes(1 << 20), 10_000, b"", crc=False))  # 10 GiB of zeros in 10 MB


def _spaces(path: Path) -> None:
    path.write_bytes(deflated(b'{"traceEvents": [', b" " * (1 << 20), 4096, b"]}", crc=False))  # 4 GiB


HOSTILE_JSON: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "a number of 100,000 digits": (_long_number, "trace.json", "a number longer than 64 characters"),
    "nesting a million deep": (_deep, "trace.json", "nesting deeper than 64"),
    "a 1 GiB string in 1 MB of gzip": (_long_string, "trace.json.gz", "a string longer than 16 MiB"),
    "10 GiB of gzip'd zeros": (_zeros, "trace.json.gz", "not JSON"),
    "4 GiB of gzip'd white space": (_spaces, "trace.json.gz", "decompresses to more than 256 times its size"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
def test_hostile_json_is_refused_fast_in_bounded_memory(
    case: str, tmp_path: Path, address: str, client: Client
) -> None:
    make, name, reason = HOSTILE_JSON[case]
    path = tmp_path / name
    make(path)
    assert path.stat().st_size < 16 << 20
    assert_refused(path, reason, address, client)


def test_the_guard_follows_strings_across_chunks_and_lets_real_traces_through(tmp_path: Path) -> None:
    """Brackets, digits and escaped quotes inside strings do not count, wherever chunks are cut."""
    inside = "[[[[" * 40 + "1" * 300 + '\\"' + "]" * 200 + "\\\\"
    events = [{"ph": "X", "cat": "cpu_op", "name": inside, "pid": 1, "tid": 1, "ts": T0_US + i, "dur": 1}
              for i in range(2000)]  # fmt: skip
    import json

    path = tmp_path / "brackets.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with KinetoTrace(path) as trace:
        rows = [chunk for part in trace.parts() for chunk in part.chunks]
    assert sum(chunk.num_rows for chunk in rows) == 2000
    assert rows[0].column("name")[0].as_py() == inside


def test_times_out_of_range_are_skipped_so_no_sum_overflows(tmp_path: Path, writer: BatchWriter) -> None:
    late_us = MAX_TIME_NS // 1000 + 1
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": T0_US, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": T0_US + 10, "dur": late_us},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": late_us, "dur": 1},
    ]
    import json

    path = tmp_path / "late.json"
    path.write_text(json.dumps({"traceEvents": events}))
    result = import_export(path, writer)
    assert result.events == {"kernel": 1}
    assert result.skipped == {"bad duration": 1, "time out of range": 1}


HOSTILE_VALUES: tuple[Any, ...] = ({}, [], [1, [2]], {"a": {}}, "1", "", True, None, 1.5, -1, 2**64 + 1, 10**30,
                                   "x" * 5000)  # fmt: skip
EVENT_FIELDS = ("ph", "cat", "ts", "dur", "pid", "tid", "name", "args", "id")
ARGS_FIELDS = ("device", "stream", "correlation", "bytes", "grid", "block", "registers per thread", "shared memory",
               "est. achieved occupancy %", "cuda_sync_kind", "name")  # fmt: skip


def test_wrong_types_in_any_event_field_are_skipped_or_taken_as_absent(tmp_path: Path) -> None:
    """Each event field read by its type: a phase that is not a string skips the event (counted), a
    value of the wrong type elsewhere skips it or reads as absent; every batch passes the server's checks."""
    import json

    from ingest.validate import validate_batch
    from tracehouse.model import DEFAULT_LIMITS

    real = tmp_path / "real.json"
    write_trace(real, KinetoSpec(steps=1, kernels_per_step=1, gzip=False))
    templates = {(e.get("ph"), e.get("cat")): e for e in json.loads(real.read_text())["traceEvents"]}
    events = list(templates.values())
    for event in templates.values():
        events += [{**event, field: value} for field in EVENT_FIELDS for value in HOSTILE_VALUES]
        args = event.get("args", {})
        events += [{**event, "args": {**args, key: value}} for key in ARGS_FIELDS for value in HOSTILE_VALUES]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 0}))
    sink = Sink()
    result = import_export(path, sink, host="h")
    for batch in sink.batches:
        validate_batch(batch, DEFAULT_LIMITS, time.time_ns())
    each = len(templates)
    assert result.skipped["phase dict"] == 2 * each and result.skipped["phase list"] == 2 * each
    assert result.skipped["phase NoneType"] >= each and result.skipped["phase bool"] == each
    assert sum(result.events.values()) > len(events) // 2, result.events


def test_an_unpaired_surrogate_after_the_events_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    event = {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": T0_US, "dur": 1}
    import json

    path.write_text(json.dumps({"traceEvents": [event], "traceName": "\ud800"}))
    with pytest.raises(TraceFileError, match="unpaired UTF-16 surrogate") as refused:
        import_export(path, Sink(), host="h")
    assert path.name in str(refused.value) and "\n" not in str(refused.value)


@pytest.fixture
def writer(address: str) -> Iterator[BatchWriter]:
    opened = BatchWriter(address, patience=10)
    yield opened
    opened.close()


# -- files that are not regular files -----------------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


NOT_FILES: dict[str, tuple[Callable[[Path], object], str]] = {
    "a link to /dev/zero": (lambda p: p.symlink_to("/dev/zero"), "a character device"),
    "a directory": (lambda p: p.mkdir(), "a directory"),
    "a FIFO": (_fifo, "a FIFO"),
}


@pytest.mark.parametrize("case", sorted(NOT_FILES))
@pytest.mark.parametrize("name", ["trace.json.gz", "report.sqlite"])
def test_what_is_not_a_regular_file_is_refused_before_it_is_opened(
    case: str, name: str, tmp_path: Path, address: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    make, kind = NOT_FILES[case]
    path = tmp_path / name
    make(path)
    good = tmp_path / "good.json.gz"
    import_refused(path, f"not a regular file ({kind})", address, capsys, lambda: nothing_stored(client),
                   (good, lambda p: write_trace(p, KinetoSpec(steps=2))))  # fmt: skip
    from agent.traces.tracefile import open_regular

    with pytest.raises(TraceFileError, match="not a regular file"):
        open_regular(path)


# -- Nsight Systems SQLite ------------------------------------------------------------------------


def _sql(*statements: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        write_export(path, Spec(steps=2))
        with sqlite3.connect(path) as connection:
            for statement in statements:
                connection.execute(statement)

    return make


KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
HOSTILE_EXPORTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "text start": (_sql(f"UPDATE {KERNEL} SET start = 'soon' WHERE rowid = 7"),
                   f"{KERNEL}.start: text where an integer belongs (row 7)"),
    "real end": (_sql(f'UPDATE {KERNEL} SET "end" = 1.5 WHERE rowid = 3'),
                 f"{KERNEL}.end: real where an integer belongs (row 3)"),
    "blob device": (_sql(f"UPDATE {KERNEL} SET deviceId = x'00ff' WHERE rowid = 2"),
                    f"{KERNEL}.deviceId: blob where an integer belongs (row 2)"),
    "a GPU past the limit": (_sql(f"UPDATE {KERNEL} SET deviceId = 99999 WHERE rowid = 2"),
                             f"{KERNEL}.deviceId: 99999 is out of range"),
    "a name id StringIds lacks": (_sql(f"UPDATE {KERNEL} SET demangledName = 1000000000 WHERE rowid = 4"),
                                  f"{KERNEL}.demangledName: 1000000000 is out of range"),
    "a negative time": (_sql(f"UPDATE {KERNEL} SET start = -9223372036854775807 WHERE rowid = 5"),
                        f"{KERNEL}.start: -9223372036854775807 is out of range"),
    "a time past 2200": (_sql(f'UPDATE {KERNEL} SET "end" = 9223372036854775807 WHERE rowid = 5'),
                         f"{KERNEL}.end: 9223372036854775807 is out of range"),
    "an event of two years": (_sql(f'UPDATE {KERNEL} SET "end" = start + 2 * 366 * 86400000000000 WHERE rowid = 6'),
                               f"{KERNEL} has rows that last longer than 366 days (row 6)"),
    "a petabyte memcpy": (_sql("UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET bytes = 1 << 60 WHERE rowid = 1"),
                          "CUPTI_ACTIVITY_KIND_MEMCPY.bytes: 1152921504606846976 is out of range"),
    "a negative correlation id": (_sql(f"UPDATE {KERNEL} SET correlationId = -1 WHERE rowid = 1"),
                                  f"{KERNEL}.correlationId: -1 is out of range"),
    "an int64-max session start": (_sql("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 9223372036854775807"),
                                   "TARGET_INFO_SESSION_START_TIME.utcEpochNs: 9223372036854775807 is out of range"),
    "a text session start": (_sql("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'now'"),
                             "TARGET_INFO_SESSION_START_TIME.utcEpochNs: text where an integer belongs"),
    "a text string id": (_sql("CREATE TABLE s AS SELECT * FROM StringIds", "DROP TABLE StringIds",
                              "ALTER TABLE s RENAME TO StringIds", "UPDATE StringIds SET id = 'one' WHERE rowid = 2"),
                         "StringIds.id: text where an integer belongs (row 2)"),
    "text in a GPU's memory": (_sql("UPDATE TARGET_INFO_GPU SET totalMemory = 'lots'"),
                               "TARGET_INFO_GPU.totalMemory: text where an integer belongs"),
    "text in a metric value": (_sql("UPDATE GPU_METRICS SET value = 'high' WHERE rowid = 9"),
                               "GPU_METRICS.value: text where a number belongs (row 9)"),
    "a blob thread id": (_sql("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = x'01' WHERE rowid = 6"),
                         "CUPTI_ACTIVITY_KIND_RUNTIME.globalTid: blob where an integer belongs (row 6)"),
    "a real nesting level": (_sql("UPDATE OSRT_API SET nestingLevel = 0.5 WHERE rowid = 1"),
                             "OSRT_API.nestingLevel: real where an integer belongs (row 1)"),
    "an NVTX range ending before it starts": (_sql('UPDATE NVTX_EVENTS SET "end" = start - 1 WHERE rowid = 3'),
                                              "NVTX_EVENTS has rows that end before they start (row 3)"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE_EXPORTS))
def test_wrong_types_and_ranges_in_an_export_are_refused_before_anything_is_sent(
    case: str, tmp_path: Path, address: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    make, reason = HOSTILE_EXPORTS[case]
    path = tmp_path / "trace.sqlite"
    make(path)
    good = tmp_path / "good.sqlite"
    import_refused(path, reason, address, capsys, lambda: nothing_stored(client),
                   (good, lambda p: write_export(p, Spec(steps=2))))  # fmt: skip


def test_checks_split_a_table_and_name_its_first_bad_row_as_one_scan_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table checked in rowid ranges on several connections: a bad row in any range is found, and of
    bad rows in two ranges the first is named, with its own reason."""
    monkeypatch.setattr(nsys_checks, "SPLIT_ROWS", 4)
    path = tmp_path / "trace.sqlite"
    write_export(path, Spec(steps=2))
    with sqlite3.connect(path) as connection:
        rows = connection.execute(f"SELECT count(), min(rowid), max(rowid) FROM {KERNEL}").fetchone()
        assert rows[0] >= 9 and rows[2] - rows[1] + 1 == rows[0]
        connection.execute(f"UPDATE {KERNEL} SET deviceId = 99999 WHERE rowid = {rows[2] - 1}")
    ranges = nsys_checks._spans(sqlite3.connect(path), KERNEL, 3)
    assert len(ranges) == 3 and ranges[0][0] == rows[1] and ranges[-1][1] == rows[2]
    assert all(before[1] + 1 == after[0] for before, after in itertools.pairwise(ranges))

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(path, check_same_thread=False)

    tables = {KERNEL: {"deviceId", "start", "end", "streamId"}}
    with pytest.raises(nsys_checks.NsysCheckError, match=rf"deviceId: 99999 is out of range .* \(row {rows[2] - 1}\)"):
        nsys_checks.check_tables(connect, tables, "trace.sqlite", 0, 0, workers=3)
    with sqlite3.connect(path) as connection:
        connection.execute(f"UPDATE {KERNEL} SET streamId = 'two' WHERE rowid = {rows[1] + 2}")
    for workers in (1, 3):
        with pytest.raises(nsys_checks.NsysCheckError, match=rf"streamId: text where .* \(row {rows[1] + 2}\)"):
            nsys_checks.check_tables(connect, tables, "trace.sqlite", 0, 0, workers=workers)
    with pytest.raises(TraceFileError, match=rf"streamId: text where .* \(row {rows[1] + 2}\)"):
        Export(path)


def _corrupt_page(path: Path) -> None:
    """A SQLite file whose second page points its first free block past the page's end: its check
    reports several lines."""
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        connection.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 20) for i in range(2000)])
    with path.open("r+b") as file:
        file.seek(4096 + 1)
        file.write((4000).to_bytes(2, "big"))


def _invalid_utf8_schema(path: Path) -> None:
    """A schema whose SQL SQLite cannot parse, with bytes that are not UTF-8 in its error message."""
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE t (a INTEGER)")
        connection.execute("PRAGMA writable_schema = ON")
        connection.execute("UPDATE sqlite_master SET sql = CAST(? AS TEXT)", (b"CREATE TABLE t (a INTEGER) \xff\xfe",))


@pytest.mark.parametrize(
    ("make", "reason"),
    [(_corrupt_page, "free space corruption"), (_invalid_utf8_schema, "corrupt or unreadable SQLite file")],
)
def test_sqlite_errors_are_refused_in_one_line(make: Callable[[Path], None], reason: str, tmp_path: Path) -> None:
    path = tmp_path / "trace.sqlite"
    make(path)
    with pytest.raises(TraceFileError, match=reason) as refused:
        import_export(path, Sink(), host="h")
    assert path.name in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def _nullable(table: str) -> tuple[str, ...]:
    """The table copied without its NOT NULL constraints, as some nsys versions write it."""
    return (f"CREATE TABLE copy AS SELECT * FROM {table}", f"DROP TABLE {table}", f"ALTER TABLE copy RENAME TO {table}")


NULLS = (
    *_nullable(KERNEL),
    f"UPDATE {KERNEL} SET deviceId = NULL, streamId = NULL, globalPid = NULL, correlationId = NULL, gridX = NULL "
    "WHERE rowid <= 3",
    *_nullable("CUPTI_ACTIVITY_KIND_MEMCPY"),
    "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET bytes = NULL",
    *_nullable("OSRT_API"),
    "UPDATE OSRT_API SET nestingLevel = NULL, globalTid = NULL",
    *_nullable("GPU_METRICS"),
    "UPDATE GPU_METRICS SET typeId = NULL WHERE rowid = 1",
    "UPDATE GPU_METRICS SET metricId = NULL WHERE rowid = 2",
    "UPDATE TARGET_INFO_GPU_METRICS SET metricName = ''",
    *_nullable("StringIds"),
    f"UPDATE StringIds SET value = NULL WHERE id = (SELECT demangledName FROM {KERNEL})",
    f"DELETE FROM StringIds WHERE id = (SELECT shortName FROM {KERNEL} WHERE rowid = 2)",
    *_nullable("TARGET_INFO_GPU"),
    "UPDATE TARGET_INFO_GPU SET id = NULL, cuDevice = NULL WHERE rowid = 1",
)


def test_empty_cells_in_an_export_take_the_columns_defaults(tmp_path: Path) -> None:
    """And a name id without a string is an empty name, a metric without a name is named by its id, a GPU
    without an index is left out."""
    from ingest.validate import validate_batch
    from tracehouse.model import DEFAULT_LIMITS

    path = tmp_path / "nulls.sqlite"
    _sql(*NULLS)(path)
    sink = Sink()
    result = import_export(path, sink, host="h")
    for batch in sink.batches:
        validate_batch(batch, DEFAULT_LIMITS, time.time_ns())
    clean = tmp_path / "clean.sqlite"
    write_export(clean, Spec(steps=2))
    expected = import_export(clean, Sink(), host="h")
    assert result.events == expected.events and result.samples == expected.samples - 2, "a metric needs its GPU"
    assert result.devices == expected.devices - 1
    kernels = next(b.events for b in sink.batches if b.batch_id.endswith("/kernel/000000"))
    assert list(kernels.gpu[:3]) == [-1] * 3 and list(kernels.pid[:3]) == [0] * 3


def test_a_string_table_of_nulls_only_leaves_every_name_empty(tmp_path: Path) -> None:
    path = tmp_path / "nameless.sqlite"
    _sql(*_nullable("StringIds"), "UPDATE StringIds SET value = NULL")(path)
    sink = Sink()
    result = import_export(path, sink, host="h")
    clean = tmp_path / "clean.sqlite"
    write_export(clean, Spec(steps=2))
    assert result.events == import_export(clean, Sink(), host="h").events
    kernels = next(b for b in sink.batches if b.batch_id.endswith("/kernel/000000"))
    assert {kernels.dictionary[code] for code in kernels.events.name} == {""}


def test_long_and_invalid_strings_in_an_export_are_cut_and_replaced(
    tmp_path: Path, writer: BatchWriter, client: Client
) -> None:
    path = tmp_path / "names.sqlite"
    write_export(path, Spec(steps=2))
    with sqlite3.connect(path) as connection:
        ids = [row[0] for row in connection.execute(f"SELECT DISTINCT demangledName FROM {KERNEL} LIMIT 2")]
        connection.execute("UPDATE StringIds SET value = ? WHERE id = ?", ("k" * (1 << 20), ids[0]))
        connection.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id = ?", (b"bad \xff\xfe name", ids[1]))
        connection.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", ("h" * 5000,))
    result = import_export(path, writer)
    assert result.events["kernel"] == 10
    assert result.attrs["utf8"] == "invalid UTF-8 replaced with U+FFFD"
    names = set(
        client.sql(f"SELECT DISTINCT name FROM events WHERE run_id = '{result.run_id}' AND kind = 'kernel'")["name"]
    )
    assert "k" * 65536 in names and "bad \ufffd\ufffd name" in names
    assert len(result.host) == 256


def test_agent_watch_logs_one_line_for_each_hostile_file_and_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tracehouse.agent.watch")
    folder = tmp_path / "exports"
    folder.mkdir()
    _sql(f"UPDATE {KERNEL} SET start = 'soon' WHERE rowid = 7")(folder / "a.sqlite")
    os.mkfifo(folder / "b.sqlite")
    (folder / "c.sqlite").symlink_to("/dev/zero")
    write_export(folder / "d.sqlite", Spec(steps=2))

    sink = Sink()
    watcher = FolderWatcher(folder, sink, tmp_path / "state.json", host="h")  # type: ignore[arg-type]
    watcher.poll()
    watcher.poll()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3, errors
    assert "a.sqlite" in errors[0] and "text where an integer belongs" in errors[0]
    assert "b.sqlite" in errors[1] and "not a regular file" in errors[1]
    assert "c.sqlite" in errors[2] and "not a regular file" in errors[2]
    assert any(r.getMessage().startswith("imported d.sqlite") for r in caplog.records)
    assert all(b.runs[0].run_id.startswith("nsys-") for b in sink.batches if b.runs)


# -- entry points a fuzz test calls ---------------------------------------------------------------


def read_all(path: Path) -> Any:
    """Everything the importer reads of a file, without a server: the entry point for a fuzz test.
    Raises TraceFileError (and nothing else) for a file it refuses."""
    opened = KinetoTrace(path) if path.suffix in (".json", ".gz") else Export(path)
    with opened as trace:
        if isinstance(trace, KinetoTrace):
            return [chunk for part in trace.parts() for chunk in part.chunks]
        chunks = [chunk for source in trace.sources() for chunk in trace.chunks(source)]
        return chunks, list(trace.metric_chunks()), trace.process_names({1}), trace.thread_names({(1, 1)})


@pytest.mark.parametrize("case", ["text start", "a text string id", "a negative time"])
def test_readers_raise_only_trace_file_errors(case: str, tmp_path: Path) -> None:
    path = tmp_path / "trace.sqlite"
    HOSTILE_EXPORTS[case][0](path)
    with pytest.raises(TraceFileError):
        read_all(path)
    good = tmp_path / "good.json"
    write_trace(good, KinetoSpec(steps=2, gzip=False))
    assert read_all(good)
