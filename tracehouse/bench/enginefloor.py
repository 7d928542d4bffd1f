"""What storing events costs the engine alone, as `bench import` reports it beside an import: the
floor under any importer on this machine.

A process of its own opens a fresh embedded store (its schema, codecs and sort order, as `serve`
makes it), inserts events that the engine itself generates (no file, no Python per row, no wire)
in inserts of an import's batch size, then waits until the engine has merged the parts. Its CPU
seconds (all threads) per event is the floor; the machine's cores over it are the most events a
second that storing alone allows, before a byte of any file is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from agent.runs.children import with_parent
from tracehouse.bench.common import _child_environment

MAX_MERGE_S = 120.0
QUIET_S = 5.0  # no merge and the same parts for this long: the engine is done

# Events as an import makes them: a few kinds, hundreds of names, launches as an extra on a fifth.
_EVENTS = """
INSERT INTO {db}.events
    (run_id, host, kind, start, end, gpu, stream, pid, tid, name, correlation_id, bytes, depth, extras, id,
     launch_start)
SELECT 'floor', 'floor', ['kernel', 'cuda_api', 'memcpy', 'nvtx', 'os_runtime'][number % 5 + 1],
    toDateTime64(1.7e9, 9, 'UTC') + toIntervalNanosecond(number * 1000),
    toDateTime64(1.7e9, 9, 'UTC') + toIntervalNanosecond(number * 1000 + 700),
    toInt16(number % 8), toInt32(7), toUInt32(1234), toUInt64(5678), concat('kernel_', toString(number % 300)),
    number, 0, toUInt16(number % 3),
    if(number % 5 = 0, map('launch', concat('grid ', toString(number % 40), 'x1x1')), map()), number,
    if(number % 5 = 0, toDateTime64(1.7e9, 9, 'UTC') + toIntervalNanosecond(number * 1000 - 500), NULL)
FROM numbers({offset}, {rows})
"""


def engine_floor(events: int, batch_rows: int, counted: int = 0) -> dict[str, Any]:
    """Store `events` generated events in inserts of `batch_rows`, in a child process: the engine's
    CPU seconds per event, merges included, and at that cost the events a second that all cores allow,
    counted as the import counts them (`counted` for `events` stored: a trace's events in the file)."""
    with tempfile.TemporaryDirectory(prefix="tracehouse-floor-") as folder:
        done = subprocess.run(
            with_parent([sys.executable, "-m", "tracehouse.bench.enginefloor", folder, str(events), str(batch_rows)]),
            env=_child_environment(folder), capture_output=True, text=True, check=True,
        )  # fmt: skip
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    per_event_us = measured["cpu_s"] * 1e6 / events
    return {
        "events": events,
        "batch_rows": batch_rows,
        "stored": measured["stored"],
        "store_cpu_us_per_event": round(per_event_us, 2),
        "merge_cpu_s": round(measured["merge_cpu_s"], 2),
        "events_per_s_on_all_cores": round((os.cpu_count() or 1) * (counted or events) / measured["cpu_s"]),
    }


def _measure(folder: str, events: int, batch_rows: int) -> dict[str, Any]:
    from store.store import Store
    from tracehouse.model import DEFAULT_LIMITS

    with Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS) as store:
        started = time.process_time()
        for offset in range(0, events, batch_rows):
            store.execute(_EVENTS.format(db=store.db, offset=offset, rows=min(batch_rows, events - offset)))
        inserted = time.process_time()
        _until_merged(store)
        merged = time.process_time()
        stored = store.query(f"SELECT count() AS stored FROM {store.db}.events").column("stored")[0].as_py()
    return {"cpu_s": merged - started, "merge_cpu_s": merged - inserted, "stored": stored}


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
    folder, events, batch_rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(_measure(folder, events, batch_rows)))
