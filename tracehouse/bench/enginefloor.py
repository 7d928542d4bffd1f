"""What storing events costs the engine alone, as `bench import` reports it beside an import: the
floor under any importer on this machine.

Once the import is done and its server stopped, a process of its own reads the events the import
stored back out of its store, each batch as it was sent (its rows in their order) into a file in the
engine's own Native format (not counted), opens a fresh embedded store (its schema, codecs and sort
order, as `serve` makes it) and stores those files, one insert each, then waits until the engine has
merged the parts. No byte of the trace is read, no Python touches a row, nothing crosses a wire: the
very rows of the import, in its inserts. Its CPU seconds (all threads) per event is the floor; the
machine's cores over it are the most events a second that storing alone allows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.runs.children import with_parent
from tracehouse.bench.common import _child_environment

MAX_MERGE_S = 120.0
QUIET_S = 5.0  # no merge and the same parts for this long: the engine is done

# The import's events, a Native file per batch: the batch is the event id's high bits (ingest/validate.py).
_DUMP = """
INSERT INTO FUNCTION file('{folder}/batch-{{_partition_id}}.native', 'Native')
PARTITION BY bitShiftRight(id, {row_bits})
SELECT * FROM {db}.events WHERE kind NOT IN ('process', 'thread') ORDER BY id
SETTINGS max_partitions_per_insert_block = 0, max_threads = 1
"""
_STORE = "INSERT INTO {db}.events SELECT * FROM file('{path}', 'Native')"
_LARGEST = """
SELECT max(rows) AS rows FROM (SELECT count() AS rows FROM {{db}}.events WHERE kind NOT IN ('process', 'thread')
GROUP BY bitShiftRight(id, {row_bits}))
"""


def engine_floor(import_folder: str, counted: int = 0) -> dict[str, Any]:
    """Store the events an import stored in the embedded store in `import_folder` (closed) again, as
    described above, in a child process: the engine's CPU seconds per event, merges included, and at
    that cost the events a second that all cores allow, counted as the import counts them (`counted`
    for the events stored: a trace's events in the file)."""
    with tempfile.TemporaryDirectory(prefix="tracehouse-floor-") as folder:
        done = subprocess.run(
            with_parent([sys.executable, "-m", "tracehouse.bench.enginefloor", import_folder, folder]),
            env=_child_environment(folder), capture_output=True, text=True, check=True,
        )  # fmt: skip
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    events = measured["stored"]
    return {
        "events": events,
        "inserts": measured["inserts"],
        "batch_rows": measured["batch_rows"],
        "stored": measured["stored"],
        "store_cpu_us_per_event": round(measured["cpu_s"] * 1e6 / max(events, 1), 2),
        "merge_cpu_s": round(measured["merge_cpu_s"], 2),
        "events_per_s_on_all_cores": round((os.cpu_count() or 1) * (counted or events) / measured["cpu_s"]),
    }


def _measure(import_folder: str, folder: str) -> dict[str, Any]:
    from store.eventids import EVENT_ID_ROW_BITS
    from store.store import Store
    from tracehouse.model import DEFAULT_LIMITS

    batches = Path(folder) / "batches"
    batches.mkdir()
    with Store.open(f"chdb://{import_folder}/store", DEFAULT_LIMITS) as imported:
        imported.execute(_DUMP.format(folder=batches, row_bits=EVENT_ID_ROW_BITS, db=imported.db))
        largest = imported.query(_LARGEST.format(row_bits=EVENT_ID_ROW_BITS)).column("rows")[0].as_py()
    files = sorted(batches.iterdir())
    with Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS) as store:
        started = time.process_time()
        for path in files:
            store.execute(_STORE.format(db=store.db, path=path))
        inserted = time.process_time()
        _until_merged(store)
        merged = time.process_time()
        stored = store.query(f"SELECT count() AS stored FROM {store.db}.events").column("stored")[0].as_py()
    return {
        "cpu_s": merged - started,
        "merge_cpu_s": merged - inserted,
        "stored": stored,
        "inserts": len(files),
        "batch_rows": largest,
    }


def _until_merged(store: Any) -> None:
    """Until no merge has run and the parts have stayed as they are for QUIET_S (the engine looks
    for parts to merge every few seconds at the most)."""
    deadline = time.monotonic() + MAX_MERGE_S
    quiet_since, seen = time.monotonic(), None
    while time.monotonic() < deadline:
        now = store.query(
            "SELECT (SELECT count() FROM system.merges) AS merging, (SELECT count() FROM system.parts "
            "WHERE active AND database = {database:String} AND table = 'events') AS parts",
            {"database": store.layout.database},
        ).to_pylist()[0]
        if now["merging"] or now != seen:
            quiet_since, seen = time.monotonic(), now
        elif time.monotonic() - quiet_since >= QUIET_S:
            return
        time.sleep(0.1)


if __name__ == "__main__":
    print(json.dumps(_measure(sys.argv[1], sys.argv[2])))
