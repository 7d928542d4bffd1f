"""Mutates real trace files and imports each one: `python -m tests.fuzz_worker FORMAT CASES SEED FIXTURE...`.

FORMAT is `kineto` (PyTorch-profiler JSON: byte-level edits of the text, and structured edits of its
events) or `nsys` (Nsight Systems SQLite: hostile values written into the columns the reader maps, and
byte edits of the file's pages). Each mutated file goes through the whole import into an in-memory sink,
and every batch it yields through the server's validator. A clean outcome is an import, a
TraceFileError of one line naming the file, or a batch the validator refuses with a BatchError; anything
else prints the case (format, seed, case number) and the traceback and exits 1. The last line is JSON:
cases, outcomes, peak RSS and the slowest case. It runs in a process of its own under an address-space
limit, so that memory growing with an attacker's input ends here, not on the machine.
"""

from __future__ import annotations

import gzip
import json
import random
import resource
import shutil
import sqlite3
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.traces.importer import import_export
from agent.traces.tracefile import TraceFileError
from ingest.validate import BatchError, validate_batch
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.v1 import batch_pb2

ADDRESS_SPACE_LIMIT = 8 << 30

# what an attacker would splice into JSON text
JSON_TOKENS = (
    b'"', b"{", b"[", b"]", b"}", b",", b":", b"-", b"\\", b"1e999", b"-1e999", b"9" * 400, b"NaN", b"null",
    b"true", b"\\u0000", b"\\ud800", b"\xff\xfe", b"\xc3", b'"ts":', b'"dur":-1', b'"ts":1e308',
    b'"dur":99999999999999999999', b'"ph":"X"', b'"ph":"f"', b'"args":{}', b"[" * 200, b"{" * 200, b"0.0000001",
    b'"name":' + b'"x' * 1000 + b'"', b'"cat":"kernel"', b'"pid":-1', b'"tid":"1"',
)  # fmt: skip

# what an attacker would write into a SQLite cell
SQL_VALUES: tuple[Any, ...] = (
    "abc", "", "12", "1e3", 1.5, -0.0, float("inf"), 2**63 - 1, -(2**63), -1, 0, 1, 2**31, None, b"\x00\xff",
    b"", "x" * 5000, "\u202e\x00\ufffd", 10**18, -(10**18),
)  # fmt: skip


class Sink:
    def __init__(self) -> None:
        self.batches: list[batch_pb2.Batch] = []

    def write(self, batch: batch_pb2.Batch) -> None:
        self.batches.append(batch)

    def flush(self) -> None:
        pass


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        where = rng.randrange(len(out) + 1)
        choice = rng.randrange(7)
        if choice == 0 and out:
            out[min(where, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif choice == 1 and out:
            out[min(where, len(out) - 1)] = rng.randrange(256)
        elif choice == 2:
            out[where:where] = rng.choice(JSON_TOKENS)
        elif choice == 3 and out:
            del out[where : where + rng.randint(1, 64)]
        elif choice == 4 and out:
            piece = out[where : where + rng.randint(1, 256)]
            out[where:where] = piece * rng.randint(1, 8)
        elif choice == 5:
            del out[where:]
        else:
            out[where:where] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return bytes(out)


def hostile_json_value(rng: random.Random) -> Any:
    return rng.choice(
        (
            -1, 0, 2**63, 2**64 + 1, -(2**63) - 1, 10**30, 1e308, -1e308, 1.5, "1", "", "x" * 10_000, None, True,
            [], {}, [1, [2, [3]]], {"a": {"b": {}}}, "\ud800", "\x00",
        )
    )  # fmt: skip


def mutate_events(text: bytes, rng: random.Random) -> bytes:
    """Hostile values in the fields of a few events, and events dropped or repeated."""
    trace = json.loads(text)
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list) or not events:
        return mutate_bytes(text, rng)
    for _ in range(rng.randint(1, 6)):
        event = rng.choice(events)
        if not isinstance(event, dict):
            continue
        field = rng.choice([*event.keys(), "ts", "dur", "ph", "pid", "tid", "name", "cat", "args", "id"])
        if field == "args" and isinstance(event.get("args"), dict) and event["args"] and rng.random() < 0.5:
            event["args"][rng.choice(list(event["args"]))] = hostile_json_value(rng)
        else:
            event[field] = hostile_json_value(rng)
    if rng.random() < 0.2:
        events.append(rng.choice(events))
    if rng.random() < 0.1 and isinstance(trace, dict):
        trace[rng.choice([*trace.keys(), "baseTimeNanoseconds", "deviceProperties"])] = hostile_json_value(rng)
    return json.dumps(trace).encode()


def kineto_case(fixture: Path, folder: Path, rng: random.Random) -> Path:
    text = gzip.decompress(fixture.read_bytes()) if fixture.suffix == ".gz" else fixture.read_bytes()
    mutated = mutate_events(text, rng) if rng.random() < 0.5 else mutate_bytes(text, rng)
    if rng.random() < 0.3:
        path = folder / "case.pt.trace.json.gz"
        path.write_bytes(gzip.compress(mutated, compresslevel=1))
    else:
        path = folder / "case.pt.trace.json"
        path.write_bytes(mutated)
    return path


def _columns(connection: sqlite3.Connection) -> list[tuple[str, str]]:
    tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    found = []
    for table in tables:
        if table.startswith("sqlite_"):
            continue
        for row in connection.execute(f'PRAGMA table_info("{table}")'):
            found.append((table, row[1]))
    return found


def nsys_case(fixture: Path, folder: Path, rng: random.Random) -> Path:
    path = folder / "case.sqlite"
    shutil.copyfile(fixture, path)
    if rng.random() < 0.15:
        data = bytearray(path.read_bytes())
        for _ in range(rng.randint(1, 8)):
            where = rng.randrange(100, len(data))  # past the header: pages, not the file's magic
            data[where] = rng.randrange(256)
        path.write_bytes(bytes(data))
        return path
    connection = sqlite3.connect(path)
    try:
        columns = _columns(connection)
        for _ in range(rng.randint(1, 4)):
            table, column = rng.choice(columns)
            rowids = [row[0] for row in connection.execute(f'SELECT rowid FROM "{table}" LIMIT 5000')]
            if not rowids:
                continue
            chosen = rng.sample(rowids, min(len(rowids), rng.choice((1, 2, 10, len(rowids)))))
            value = rng.choice(SQL_VALUES)
            if value == "\u202e\x00\ufffd" and rng.random() < 0.5:
                connection.executemany(
                    f'UPDATE "{table}" SET "{column}" = CAST(x\'fffe80\' AS TEXT) WHERE rowid = ?',
                    [(r,) for r in chosen],
                )
                continue
            connection.executemany(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = ?', [(value, r) for r in chosen])
        connection.commit()
    except sqlite3.DatabaseError:
        pass  # a constraint refused this edit: import what was made
    finally:
        connection.close()
    return path


MAKERS: dict[str, Callable[[Path, Path, random.Random], Path]] = {"kineto": kineto_case, "nsys": nsys_case}


def check_one(path: Path) -> str:
    sink = Sink()
    try:
        import_export(path, sink, host="fuzz-host")
    except TraceFileError as refusal:
        message = str(refusal)
        if "\n" in message or path.name not in message:
            raise AssertionError(f"a refusal must be one line naming the file: {message!r}") from refusal
        return "refused"
    received = time.time_ns()
    refused = False
    for batch in sink.batches:
        try:
            validate_batch(batch, DEFAULT_LIMITS, received)
        except BatchError:
            refused = True
    return "batch refused by the validator" if refused else "imported"


def main(argv: list[str]) -> int:
    kind, cases, seed, *fixtures = argv
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
    make = MAKERS[kind]
    outcomes: Counter[str] = Counter()
    slowest = (0.0, -1)
    with tempfile.TemporaryDirectory(prefix="tracehouse-fuzz-") as tmp:
        folder = Path(tmp)
        for case in range(int(cases)):
            rng = random.Random(f"{seed}/{kind}/{case}")
            fixture = Path(rng.choice(fixtures))
            path = make(fixture, folder, rng)
            started = time.perf_counter()
            try:
                outcomes[check_one(path)] += 1
            except BaseException:
                print(f"FUZZ FAILURE: {kind} seed {seed} case {case} fixture {fixture.name}", file=sys.stderr)
                traceback.print_exc()
                kept = Path(tempfile.gettempdir()) / f"tracehouse-fuzz-{kind}-{seed}-{case}{''.join(path.suffixes)}"
                shutil.copyfile(path, kept)
                print(f"the file is kept at {kept}", file=sys.stderr)
                return 1
            slowest = max(slowest, (time.perf_counter() - started, case))
            path.unlink()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"cases": int(cases), "outcomes": outcomes, "peak_rss_bytes": peak,
                      "slowest_s": round(slowest[0], 3), "slowest_case": slowest[1]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
