"""`tracehouse bench export`: writing a run as a Perfetto trace and as Chrome JSON, per event.

A synthetic Nsight Systems export is imported through a real server into a temporary store;
the run is then fetched through the Query service (the baseline: what any export has to read)
and written in both formats. The Perfetto trace is read back with Perfetto's own protos, so a
fast writer that loses events does not pass.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from agent.traces.nsys_synthetic import Spec, write_export
from query.client import Client
from query.export import encode, fetch
from store.store import Store
from tracehouse.bench.common import _stamp, _timed
from tracehouse.cli.serve import create_server
from tracehouse.model import DEFAULT_LIMITS


def _events(trace: bytes) -> int:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    return sum(
        packet.track_event.type in (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_INSTANT)
        for packet in Trace.FromString(trace).packet
        if packet.HasField("track_event")
    )


def bench_export(steps: int) -> dict[str, Any]:
    result = _stamp("export", "perfetto", "chdb")
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        store = Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS)
        server = create_server(store, "127.0.0.1:0", store.limits)
        try:
            path = Path(folder) / "synthetic.sqlite"
            write_export(path, Spec(steps=steps, kernels_per_step=20, gpu_metrics=False))
            writer = BatchWriter(f"127.0.0.1:{server.port}")
            try:
                run = import_export(path, writer).run_id
            finally:
                writer.close()
            with Client(f"127.0.0.1:{server.port}", timeout=600) as client:
                fetched: dict[str, Any] = {}
                fetch_s = _timed(lambda: fetched.update(data=fetch(client, run=run, host=None, start=None, end=None)))
            data = fetched["data"]
            events = len(data.events)
            written: dict[str, bytes] = {}
            times: dict[str, float] = {}
            for fmt in ("perfetto", "chrome"):
                started = time.perf_counter()
                written[fmt] = encode(data, fmt)
                times[fmt] = time.perf_counter() - started
        finally:
            server.stop(5)
            store.close()
    slices = _events(written["perfetto"])
    result["data"] = {"events": events, "steps": steps}
    result["baseline"] = {"what": "fetching the run through the Query service", "seconds": round(fetch_s, 3)}
    result["formats"] = {
        fmt: {
            "seconds": round(seconds, 3),
            "bytes": len(written[fmt]),
            "bytes_per_event": round(len(written[fmt]) / max(events, 1), 1),
            "us_per_event": round(seconds * 1e6 / max(events, 1), 2),
            "vs_fetch": round(seconds / max(fetch_s, 1e-9), 2),
        }
        for fmt, seconds in times.items()
    }
    result["perfetto_events"] = slices
    result["complete"] = slices == events
    return result
