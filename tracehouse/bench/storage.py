"""`tracehouse bench storage`: bytes on disk per sample value (raw, each rollup, all in) and per event.

Telemetry comes from the agent's own sampler over the simulated backend on a simulated
clock (so an hour of 8 GPUs at 10 Hz takes minutes to make, with the lateness of real ticks);
events from a synthetic Nsight Systems export through the real importer. Sizes are read
from `system.parts` after the parts are merged, as a long-running store would have them.
The baseline: the same rows as Parquet with zstd, written in this process.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from agent.shipping.batcher import Batcher
from agent.shipping.spool import EncodedBatch
from agent.shipping.stats import Stats
from agent.shipping.writer import BatchWriter
from agent.telemetry.sampler import Sampler
from agent.telemetry.simulated import SimulatedBackend
from agent.traces.importer import import_export
from agent.traces.nsys_synthetic import Spec, write_export
from ingest.validate import validate_batch
from store.store import Store
from tracehouse.cli.serve import create_server
from tracehouse.model import DEFAULT_LIMITS, ROLLUP_SECONDS
from tracehouse.timefmt import NS_PER_S
from tracehouse.v1 import ingest_pb2

GOAL_BYTES_PER_VALUE = 1.0  # raw samples and every rollup of them together
GOAL_EVENT_COMPRESSION = 8.0
T0 = 1_790_000_000 * NS_PER_S


def simulated_telemetry(store: Store, gpus: int, seconds: float, interval: float, seed: int = 11) -> int:
    """`seconds` of `gpus` simulated GPUs sampled every `interval` s, stored; returns values."""
    clock = [T0 / NS_PER_S]
    jitter = random.Random(seed)

    def write(batch: EncodedBatch) -> None:
        request = ingest_pb2.WriteRequest.FromString(batch.payload)
        store.write(validate_batch(request.batch, store.limits, time.time_ns(), batch.payload), time.time_ns())

    def wall_ns() -> int:
        clock[0] += 2e-5  # the next GPU's reading, 20 µs later
        return int(clock[0] * NS_PER_S)

    batcher = Batcher("bench-storage", "gpu-node-01", write, max_values=200_000, monotonic=lambda: clock[0])
    stats = Stats()
    sampler = Sampler(SimulatedBackend(gpus, clock=lambda: clock[0], started=clock[0]), batcher, stats, wall_ns=wall_ns)
    ticks = int(seconds / interval)
    slow_every = max(1, round(1.0 / interval))
    start = clock[0]
    for tick in range(ticks):
        # a tick wakes 100 µs late plus an exponential tail (this machine, loaded: 118-340 µs
        # from the 1st to the 99th percentile)
        clock[0] = start + tick * interval + 1e-4 + jitter.expovariate(1e4)
        sampler.fast_tick()
        if tick % slow_every == 0:
            sampler.slow_tick()
    batcher.flush()
    return stats.sampled


def synthetic_events(store: Store, steps: int) -> int:
    """A synthetic Nsight Systems export imported through a real server; returns events."""
    server = create_server(store, "127.0.0.1:0", store.limits)
    try:
        with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
            path = Path(folder) / "synthetic.sqlite"
            write_export(path, Spec(steps=steps, kernels_per_step=20, gpu_metrics=False))
            writer = BatchWriter(f"127.0.0.1:{server.port}")
            try:
                result = import_export(path, writer)
            finally:
                writer.close()
        return sum(result.events.values())
    finally:
        server.stop(5)


def on_disk(store: Store, table: str) -> dict[str, int]:
    store.execute(f"OPTIMIZE TABLE {{db}}.{table} FINAL")
    row = store.query(
        "SELECT sum(rows) AS rows, sum(bytes_on_disk) AS on_disk, sum(data_compressed_bytes) AS compressed, "
        "sum(data_uncompressed_bytes) AS uncompressed FROM system.parts "
        "WHERE database = {database:String} AND table = {table:String} AND active",
        {"database": store.location.database, "table": table},
    ).to_pylist()[0]
    return {name: int(value) for name, value in row.items()}


def parquet_bytes(store: Store, table: str, folder: Path) -> int:
    path = folder / f"{table}.parquet"
    pq.write_table(store.query(f"SELECT * FROM {{db}}.{table}"), path, compression="zstd")
    return path.stat().st_size


def bench_storage(gpus: int, minutes: float, interval: float, steps: int) -> dict[str, Any]:
    from tracehouse.bench.common import _stamp

    with (
        tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder,
        Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS) as store,
    ):
        values = simulated_telemetry(store, gpus, minutes * 60, interval)
        events = synthetic_events(store, steps)
        samples = on_disk(store, "samples")
        stored_events = on_disk(store, "events")
        rollups = {table: on_disk(store, table) for table in ROLLUP_SECONDS}
        parquet = {table: parquet_bytes(store, table, Path(folder)) for table in ("samples", "events")}
    per_value = samples["on_disk"] / samples["rows"]
    all_in = samples["on_disk"] + sum(sizes["on_disk"] for sizes in rollups.values())
    compression = stored_events["uncompressed"] / stored_events["compressed"]
    return {
        **_stamp("storage", "chdb"),
        "telemetry": {"gpus": gpus, "minutes": minutes, "interval_s": interval, "values": values},
        "samples": samples
        | {
            "bytes_per_value": round(per_value, 3),
            "parquet_zstd_bytes_per_value": round(parquet["samples"] / samples["rows"], 3),
            "ratio_to_parquet": round(samples["on_disk"] / parquet["samples"], 3),
        },
        "rollups": {
            table: sizes | {"bytes_per_value": round(sizes["on_disk"] / values, 4)} for table, sizes in rollups.items()
        },
        "all_in": {"on_disk": all_in, "bytes_per_value": round(all_in / values, 3)},
        "events": stored_events
        | {
            "imported": events,
            "bytes_per_event": round(stored_events["on_disk"] / stored_events["rows"], 2),
            "compression": round(compression, 2),
            "parquet_zstd_bytes_per_event": round(parquet["events"] / stored_events["rows"], 2),
        },
        "goal": {
            "bytes_per_value_all_in": GOAL_BYTES_PER_VALUE,
            "event_compression": GOAL_EVENT_COMPRESSION,
            "met": all_in / values <= GOAL_BYTES_PER_VALUE and compression >= GOAL_EVENT_COMPRESSION,
        },
    }
