"""What reading a file costs before any importer maps an event of it, as `bench import` counts it in
the practical floor (tracehouse/bench/imports.py): the part of an import that no importer avoids.

- Nsight export: opening it as the importer does (agent/traces/nsys.Export: the file's checks, the
  integrity check, every column's rules, StringIds, the copy of the API calls that GPU work is joined
  to) and reading every row of the event and metric sources through SQLite/ADBC with the importer's
  own SQL, in its batches, mapping nothing.
- Kineto trace: the file's checks as the importer makes them (agent/traces/kineto_scan.py: the first
  pass, which hashes the file, proves its gzip whole and its text UTF-8 and reads the members after
  the events; then the text through the JSON guard, which bounds nesting, numbers and strings, as any
  reader of untrusted JSON must), and the text parsed whole with the importer's parser (msgspec into
  kineto_blocks.Event structs), mapping nothing. As for an Nsight export, the checks are in the floor.

Each runs in a process of its own; its CPU seconds (all threads), from when its modules are imported
to the last row read, are the figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from agent.runs.children import with_parent
from agent.traces.kineto_blocks import Event
from agent.traces.kineto_scan import TraceText, first_pass
from agent.traces.nsys import Export

KINDS = ("nsys", "kineto")


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[Event | int] = []


def read_floor(path: Path, kind: str) -> dict[str, Any]:
    """CPU seconds of reading `path` (`kind` "nsys" or "kineto") as described above, and the rows or
    events read, in a child process."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
    import tempfile

    from tracehouse.bench.common import _child_environment

    with tempfile.TemporaryDirectory(prefix="tracehouse-read-") as folder:
        done = subprocess.run(
            with_parent([sys.executable, "-m", "tracehouse.bench.readfloor", kind, str(path)]),
            env=_child_environment(folder), capture_output=True, text=True, check=True,
        )  # fmt: skip
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def _read_nsys(path: Path) -> int:
    rows = 0
    with Export(path) as export:
        for source in export.sources():
            for batch in export._read(source.sql, source.table):
                rows += batch.num_rows
        for batch in export.metric_chunks():
            rows += batch.num_rows
    return rows


def _read_kineto(path: Path) -> int:
    text = TraceText(path, first_pass(path))
    try:
        whole = b"".join(iter(lambda: text.read(1 << 20), b""))
    finally:
        text.close()
    if whole.lstrip()[:1] == b"[":
        events = msgspec.json.decode(whole, type=list[Event | int])
    else:
        events = msgspec.json.decode(whole, type=_Trace).traceEvents
    return len(events)


def _measure(kind: str, path: Path) -> dict[str, Any]:
    import time

    started = time.process_time()
    read = _read_nsys(path) if kind == "nsys" else _read_kineto(path)
    return {"cpu_s": time.process_time() - started, "read": read}


if __name__ == "__main__":
    print(json.dumps(_measure(sys.argv[1], Path(sys.argv[2]))))
