"""`tracehouse bench ingest`: sample values through the Ingest service against inserting the
same values straight into the store as the server inserts them (store/arrowinsert.py), in the same
process on the same data: the samples alone (`direct`), and the rows the store keeps for them, the
samples and their rollups (`direct_rollups`: what a direct insert stored until 2026-12-02, when
materialized views made the rollups of every insert). Beside them, the samples as the Arrow format,
the baseline until 2026-12-07.

Each path keeps `in_flight` calls or inserts in flight: by default as many as the writer of bulk
batches, `tracehouse import`'s, keeps (agent/shipping/writer.py), which the group commit stores
together. The direct insert is also run with two in flight (`direct_2`, as the bench ran it before),
and the goal is judged against the better of the two."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
import numpy as np

from agent.shipping.writer import LARGE_IN_FLIGHT
from ingest.commitpolicy import CommitPolicy
from ingest.validate import validate_batch
from store.arrowinsert import insert_arrow
from store.rollup import rollups
from store.store import Store
from tracehouse.batch import BatchBuilder, encode_request
from tracehouse.bench.common import _each, _stamp, _timed
from tracehouse.channel import encoded_write
from tracehouse.cli.serve import create_server
from tracehouse.model import DEFAULT_LIMITS, ROLLUP_SECONDS
from tracehouse.v1 import batch_pb2, ingest_pb2

GPUS = 8
METRICS = tuple(
    f"gpu.{name}"
    for name in (
        "util", "mem_util", "mem_used", "mem_total", "power", "energy", "temp", "sm_clock",
        "mem_clock", "pcie_tx", "pcie_rx", "throttle", "ecc_sbe", "ecc_dbe", "fan", "perf_state",
    )
)  # fmt: skip
TICK_NS = 100_000_000  # 10 Hz
GOAL_RATIO = 0.9
GOAL_VALUES_PER_S = 2_000_000
FINEST_ROLLUP = min(ROLLUP_SECONDS, key=ROLLUP_SECONDS.__getitem__)


def telemetry_batches(run_id: str, rows: int, batch_rows: int, t0: int) -> list[batch_pb2.Batch]:
    """`rows` sample values shaped like the agent's: every metric of every GPU per 10 Hz tick,
    one timestamp per GPU tick, values that change slowly."""
    per_tick = GPUS * len(METRICS)
    ticks_per_batch = max(1, batch_rows // per_tick)
    ticks = max(1, rows // per_tick)
    rng = np.random.default_rng(7)
    batches = []
    for first in range(0, ticks, ticks_per_batch):
        count = min(ticks_per_batch, ticks - first)
        builder = BatchBuilder(f"{run_id}-{first}", run_id=run_id, host="bench-host")
        tick_times = t0 + (first + np.arange(count)) * TICK_NS
        for gpu in range(GPUS):
            jitter = rng.integers(0, 50_000, count)  # the sampler's µs-scale jitter
            for m, metric in enumerate(METRICS):
                values = np.round(50 + 40 * np.sin((first + np.arange(count)) / (20 + m)), 1)
                builder.add_samples(metric, tick_times + jitter, values, gpu=gpu)
        batches.append(builder.build())
    return batches


def bench_ingest(
    rows: int,
    batch_rows: int,
    rounds: int,
    store_url: str | None,
    in_flight: int = LARGE_IN_FLIGHT,
    ack_once_stored: bool = False,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        store = Store.open(store_url or f"chdb://{folder}/store", DEFAULT_LIMITS)
        # throughput, not admission: two writers never hold more than the store takes, and on a busy
        # machine the default target (0.7 s) turned the second away
        commit = CommitPolicy(bulk_rows=None) if ack_once_stored else CommitPolicy()
        server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS, ack_target_ms=60_000, commit=commit)
        channel = grpc.insecure_channel(
            f"127.0.0.1:{server.port}", options=[("grpc.max_send_message_length", 256 << 20)]
        )
        write = encoded_write(channel)  # the requests are encoded before the clock starts
        direct = store.location.client()
        try:
            result = _run(rows, batch_rows, rounds, in_flight, store, write, direct)
            assert server.commit is not None
            server.commit.settle_answered()  # the groups answered at the claim, stored
            groups = server.commit.groups  # the gRPC path's: the direct inserts make none
            return {
                **result,
                "grpc_groups": groups,  # the group commits the gRPC path was stored in: each one's fixed costs shared
                "grpc_rows_per_group": round(result["sent_rows"] / max(1, groups)),
                "ack_once_stored": ack_once_stored,
            }
        finally:
            direct.close()
            channel.close()
            server.stop(5)
            store.close()


def _stored_per_path(store: Store, sql: str) -> dict[str, int]:
    """`sql`'s count per path (the first word of the run ids each path writes under)."""
    return {row["path"]: int(row["n"]) for row in store.query(sql + " GROUP BY path").to_pylist()}


def _samples(run_id: str, rows: int, batch_rows: int, t0: int) -> list[Any]:
    """The samples of telemetry_batches as the server validates them: Arrow tables to insert directly."""
    return [
        validate_batch(batch, DEFAULT_LIMITS, 0).samples for batch in telemetry_batches(run_id, rows, batch_rows, t0)
    ]


def _run(
    rows: int,
    batch_rows: int,
    rounds: int,
    in_flight: int,
    store: Store,
    write: Callable[..., ingest_pb2.WriteResponse],
    direct: Any,
) -> dict[str, Any]:
    t0 = 1_790_000_000_000_000_000
    paths = ("grpc", "direct", "direct_2", "direct_rollups", "arrow_format")
    rates: dict[str, list[float]] = {name: [] for name in (*paths, "encode")}
    cpu_s = dict.fromkeys(paths, 0.0)  # the process's CPU, all threads: the engine's too
    sent = 0
    for round_ in range(rounds):
        span = rows // (GPUS * len(METRICS)) * TICK_NS
        start = t0 + round_ * 5 * span
        started = time.perf_counter()
        encoded = [encode_request(batch) for batch in telemetry_batches(f"grpc-{round_}", rows, batch_rows, start)]
        encode_seconds = time.perf_counter() - started
        tables = _samples(f"direct-{round_}", rows, batch_rows, start + span)
        as_format = _samples(f"arrow-{round_}", rows, batch_rows, start + 2 * span)
        with_rollups = _samples(f"rollups-{round_}", rows, batch_rows, start + 3 * span)
        two_in_flight = _samples(f"two-{round_}", rows, batch_rows, start + 4 * span)
        values = sum(table.num_rows for table in tables)
        rates["encode"].append(values / encode_seconds)

        def send(request: bytes) -> None:
            write(request, timeout=120)

        def insert_into(table: str, data: Any) -> None:  # as the server inserts (store/arrowinsert.py)
            insert_arrow(direct, store.location.engine, f"{store.db}.{table}", data)

        def insert(samples: Any) -> None:
            insert_into("samples", samples)

        def insert_with_rollups(samples: Any) -> None:  # the rollups as the server makes them (store/rollup.py)
            insert(samples)
            for rollup, made in rollups(samples).items():
                insert_into(rollup, made)

        def insert_format(samples: Any) -> None:  # the baseline until 2026-12-07: the Arrow format, as a file
            direct.insert_arrow(f"{store.db}.samples", samples)

        # rotate which goes first, so that merges started by one do not tax only the next
        runs: list[tuple[str, Callable[[], None]]] = [
            ("grpc", partial(_each, in_flight, send, encoded)),
            ("direct", partial(_each, in_flight, insert, tables)),
            ("direct_2", partial(_each, 2, insert, two_in_flight)),
            ("direct_rollups", partial(_each, in_flight, insert_with_rollups, with_rollups)),
            ("arrow_format", partial(_each, in_flight, insert_format, as_format)),
        ]
        for name, work in runs[round_ % len(runs) :] + runs[: round_ % len(runs)]:
            cpu_before = time.process_time()
            rates[name].append(values / _timed(work))
            cpu_s[name] += time.process_time() - cpu_before
        sent += values
    stored = _stored_per_path(store, "SELECT splitByChar('-', run_id)[1] AS path, count() AS n FROM {db}.samples")
    # the values the finest rollup sums up, per path: every value of the paths that make rollups, none of the others'
    rolled_up = _stored_per_path(
        store, f"SELECT splitByChar('-', run_id)[1] AS path, sum(count) AS n FROM {{db}}.{FINEST_ROLLUP}"
    )
    grpc_rate, direct_rate, two_rate, same_rows_rate = (
        statistics.median(rates[name]) for name in ("grpc", "direct", "direct_2", "direct_rollups")
    )
    best_direct = max(direct_rate, two_rate)
    return {
        **_stamp("ingest", "chdb", "grpcio"),
        "rows_per_round": rows,
        "batch_rows": batch_rows,
        "rounds": rounds,
        "in_flight": in_flight,
        "grpc_rows_per_s": round(grpc_rate),
        "direct_rows_per_s": round(direct_rate),
        "ratio": round(grpc_rate / direct_rate, 3),
        "grpc_rows_per_s_rounds": [round(r) for r in rates["grpc"]],
        "direct_rows_per_s_rounds": [round(r) for r in rates["direct"]],
        # CPU per value is steadier than rows/s on a busy machine (merges may land in either's time)
        "grpc_cpu_us_per_row": round(cpu_s["grpc"] * 1e6 / sent, 3),
        "direct_cpu_us_per_row": round(cpu_s["direct"] * 1e6 / sent, 3),
        "cpu_ratio": round(cpu_s["direct"] / cpu_s["grpc"], 3),
        # the direct insert with two in flight, and the better of the two direct rates: what the goal is against
        "direct_2_in_flight_rows_per_s": round(two_rate),
        "direct_2_in_flight_cpu_us_per_row": round(cpu_s["direct_2"] * 1e6 / sent, 3),
        "ratio_to_best_direct": round(grpc_rate / best_direct, 3),
        "cpu_ratio_to_best_direct": round(min(cpu_s["direct"], cpu_s["direct_2"]) / cpu_s["grpc"], 3),
        # the same rows stored both ways: the samples and their rollups, which the gRPC path makes and `direct`
        # leaves out (until 2026-12-02 materialized views made them of any insert, the direct one's too)
        "direct_rollups_rows_per_s": round(same_rows_rate),
        "ratio_same_rows": round(grpc_rate / same_rows_rate, 3),
        "direct_rollups_cpu_us_per_row": round(cpu_s["direct_rollups"] * 1e6 / sent, 3),
        "cpu_ratio_same_rows": round(cpu_s["direct_rollups"] / cpu_s["grpc"], 3),
        # beside them, the direct insert as the Arrow format (clickhouse-connect's insert_arrow): the baseline of
        # the rows before 2026-12-07, which the store's own insert (store/arrowinsert.py) now beats
        "arrow_format_rows_per_s": round(statistics.median(rates["arrow_format"])),
        "ratio_to_arrow_format": round(grpc_rate / statistics.median(rates["arrow_format"]), 3),
        "arrow_format_cpu_us_per_row": round(cpu_s["arrow_format"] * 1e6 / sent, 3),
        "client_encode_rows_per_s": round(statistics.median(rates["encode"])),
        "sent_rows": sent,
        "stored_rows": int(stored.get("grpc", 0)),
        "stored_rows_direct": int(stored.get("direct", 0)),
        "stored_rows_direct_2": int(stored.get("two", 0)),
        "stored_rows_arrow_format": int(stored.get("arrow", 0)),
        "stored_rows_direct_rollups": int(stored.get("rollups", 0)),
        "rolled_up_rows": {path: rolled_up.get(path, 0) for path in stored},
        "goal": {
            "ratio": GOAL_RATIO,
            "values_per_s": GOAL_VALUES_PER_S,
            "met": grpc_rate / best_direct >= GOAL_RATIO and grpc_rate >= GOAL_VALUES_PER_S,
            "met_same_rows": grpc_rate / same_rows_rate >= GOAL_RATIO and grpc_rate >= GOAL_VALUES_PER_S,
        },
    }
