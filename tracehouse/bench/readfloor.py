"""What reading a file costs before any importer maps an event of it, as `bench import` counts it in
the practical floor (tracehouse/bench/imports.py): the part of an import that no importer avoids.

- Nsight export: opening it as the importer does (agent/traces/nsys.Export: the file's checks, the
  integrity check, every column's rules, StringIds, the copy of the API calls that GPU work is joined
  to) and reading every row of the event and metric sources through SQLite/ADBC with the importer's
  own SQL, in its batches, mapping nothing.
- Kineto trace: the file's checks as the importer makes them (agent/traces/kineto_scan.py: the first
  pass, which hashes the file, proves its gzip whole and its text UTF-8 and reads the members after
  the events; the members before them; then the text through the JSON guard, which bounds nesting,
  numbers and strings, as any reader of untrusted JSON must), and the events parsed as the importer
  parses them, block by block (agent/traces/kineto_blocks.EventBlocks: msgspec into Event structs),
  mapping nothing. As for an Nsight export, the checks are in the floor, and the reading is the
  importer's own: parsed whole, the same text cost 0.7-1.5 s of CPU more for 1 M events (its structs
  and dicts all alive at once), which no importer has to spend.

Each runs in a process of its own; its CPU seconds (all threads), from when its modules are imported
to the last row read, are the figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.runs.children import with_parent
from agent.traces.kineto_blocks import EventBlocks
from agent.traces.kineto_scan import TraceText, first_pass, head_members
from agent.traces.nsys import Export

KINDS = ("nsys", "kineto")


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
    scan = first_pass(path)
    lists_before = head_members(path, scan)[1]
    text = TraceText(path, scan, marking=True)
    try:
        return sum(len(block) for block in EventBlocks(text, path.name, lists_before, scan.layout))
    finally:
        text.close()


def _measure(kind: str, path: Path) -> dict[str, Any]:
    import time

    started = time.process_time()
    read = _read_nsys(path) if kind == "nsys" else _read_kineto(path)
    return {"cpu_s": time.process_time() - started, "read": read}


if __name__ == "__main__":
    print(json.dumps(_measure(sys.argv[1], Path(sys.argv[2]))))
