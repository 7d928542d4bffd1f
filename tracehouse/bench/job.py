"""`tracehouse bench job`: the job view of a big job (1,024 ranks x 2,000 steps: 2 M step rows) through a
real server and store, beside the engine's own scan of the same rows in the same run.

The ranks' runs go in through Ingest; their steps, already in parts, straight into `job_steps` under the
generation the runs make (the view then answers from them, as from a job assembled before: assembling
from events is not timed here). One rank is slowed by 20 % over 100 steps, so the view has a straggler
to find (its finding is checked). Timings are medians of `repeats` asks, after one warm-up ask of each."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

JOB = "bench-job"
T0 = 1_790_000_000_000_000_000
STEP_NS = 100_000_000
GOAL_S = 2.0


@contextlib.contextmanager
def _served() -> Iterator[tuple[Any, Any, str]]:
    from query.client import Client
    from store.store import Store
    from tracehouse.cli.serve import create_server
    from tracehouse.model import DEFAULT_LIMITS

    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-job-") as folder:
        store = Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS)
        server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
        try:
            with Client(f"127.0.0.1:{server.port}", timeout=600) as client:
                yield store, client, f"127.0.0.1:{server.port}"
        finally:
            server.stop(grace=5)
            store.close()


def _runs(address: str, ranks: int, steps: int) -> None:
    import grpc

    from tracehouse.batch import BatchBuilder
    from tracehouse.v1 import ingest_pb2, ingest_pb2_grpc

    builder = BatchBuilder(f"{JOB}/runs")
    for rank in range(ranks):
        attrs = {"job": JOB, "rank": str(rank), "world_size": str(ranks), "local_rank": str(rank % 8)}
        builder.add_run(f"{JOB}-r{rank}", name=f"r{rank}", host=f"node-{rank // 8:04d}", start=T0,
                        end=T0 + steps * STEP_NS, attrs=attrs)  # fmt: skip
    with grpc.insecure_channel(address) as channel:
        ingest_pb2_grpc.IngestStub(channel).Write(ingest_pb2.WriteRequest(batch=builder.build()), timeout=120)


def slowed(ranks: int, steps: int) -> tuple[int, int, int]:
    """The slow rank, its first slow step and how many (700, 500 and 100 of 1,024 ranks x 2,000 steps)."""
    return ranks * 700 // 1024, steps // 4, max(1, steps // 20)


def step_rows(ranks: int, steps: int, generation: str, seed: int = 0) -> pa.Table:
    """Every rank's steps in parts: 3 % noise in compute, the slow rank 20 % slower over its range, the
    others waiting for the slowest in exposed communication."""
    rng = np.random.default_rng(seed)
    compute = (60e6 * rng.lognormal(0, 0.03, size=(steps, ranks))).astype(np.int64)
    rank, first, count = slowed(ranks, steps)
    compute[first : first + count, rank] = compute[first : first + count, rank] * 6 // 5
    data = np.full((steps, ranks), 5_000_000, np.int64)
    own = compute + data
    dur = own.max(axis=1, keepdims=True) + 10_000_000
    comm = dur - own
    starts = T0 + np.concatenate([[0], np.cumsum(dur[:-1, 0])])
    n = ranks * steps
    return pa.table({
        "job": pa.array([JOB] * n).dictionary_encode(), "generation": pa.array([generation] * n).dictionary_encode(),
        "rank": np.tile(np.arange(ranks, dtype=np.uint32), steps),
        "step": np.repeat(np.arange(steps, dtype=np.int64), ranks),
        "start": pa.array(np.repeat(starts, ranks), pa.timestamp("ns", "UTC")),
        "dur_ns": np.broadcast_to(dur, (steps, ranks)).ravel(), "compute_ns": compute.ravel(),
        "comm_ns": comm.ravel(), "data_ns": data.ravel(), "idle_ns": np.zeros(n, np.int64),
    })  # fmt: skip


def _jobs_rows(ranks: int, steps: int, generation: str) -> pa.Table:
    n = ranks
    return pa.table({
        "job": [JOB] * n, "generation": [generation] * n, "rank": np.arange(n, dtype=np.uint32),
        "run_id": [f"{JOB}-r{r}" for r in range(n)], "host": [f"node-{r // 8:04d}" for r in range(n)],
        "gpu": (np.arange(n) % 8).astype(np.int16), "world_size": np.full(n, ranks, np.uint32),
        "local_rank": (np.arange(n) % 8).astype(np.int32), "steps": np.full(n, steps, np.uint32),
        "offset_ns": np.zeros(n, np.int64), "uncertainty_ns": np.zeros(n, np.int64),
        "alignment": ["same host"] * n, "note": [""] * n,
        "assembled": pa.array([time.time_ns()] * n, pa.timestamp("ns", "UTC")),
    })  # fmt: skip


def _median_seconds(repeats: int, call: Any) -> tuple[float, Any]:
    result = call()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def bench_job(ranks: int = 1024, steps: int = 2000, repeats: int = 3) -> dict[str, Any]:
    from query import jobassemble
    from query.jobview import STEPS_SQL

    with _served() as (store, client, address):
        _runs(address, ranks, steps)
        runs, counts = jobassemble.job_runs(store.query, JOB)
        generation = jobassemble.fingerprint(runs, counts)
        table = step_rows(ranks, steps, generation)
        for at in range(0, table.num_rows, 1 << 20):
            store.append("job_steps", table.slice(at, 1 << 20))
        store.append("jobs", _jobs_rows(ranks, steps, generation))
        params = {"job": JOB, "generation": generation}
        scan_s, scanned = _median_seconds(repeats, lambda: store.query(STEPS_SQL, params))
        view_s, view = _median_seconds(repeats, lambda: client.job(JOB))
    found = view.stragglers.to_dict(orient="records")
    rank, first, count = slowed(ranks, steps)
    top = found[0] if found else {}
    return {
        "ranks": ranks, "steps": steps, "step_rows": scanned.num_rows, "repeats": repeats,
        "job_view_s": round(view_s, 3), "engine_scan_s": round(scan_s, 3), "ratio": round(view_s / scan_s, 2),
        "straggler": {"expected": {"rank": rank, "first_step": first, "last_step": first + count - 1},
                      "found": {k: top.get(k) for k in ("rank", "first_step", "last_step", "lost_ns", "cause")},
                      "stragglers": len(found)},
        "goal": {"job_view_s_at_most": GOAL_S, "met": view_s <= GOAL_S},
    }  # fmt: skip
