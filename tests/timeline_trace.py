"""A synthetic training trace kept in Python for oracles: overlapping kernels on several
streams and GPUs, nested NVTX ranges and overlapping start/end ranges, ranges with no GPU
work, syncs, work launched outside any range, and two GPUs' telemetry."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tests.helpers import request
from tracehouse.batch import BatchBuilder
from tracehouse.v1 import ingest_pb2_grpc

US = 1_000
MS = 1_000_000
T0 = 1_790_000_000_000_000_000
HOST = "node-1"
PID = 100


@dataclass
class Trace:
    """What a run's events are, kept in Python for the oracle."""

    run_id: str
    work: list[dict[str, Any]] = field(default_factory=list)  # kernels, memcpy
    ranges: list[dict[str, Any]] = field(default_factory=list)
    syncs: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    start: int = T0
    end: int = T0


def make_trace(run_id: str, seed: int, steps: int = 40, t0: int = T0) -> Trace:
    """A run of one process on HOST from t0: runs of one process on one host follow each other."""
    rng = random.Random(seed)
    trace = Trace(run_id, start=t0, end=t0)
    correlation = 1
    for tid in (100, 101):
        t = t0 + rng.randint(0, 50) * US
        lanes: list[int] = []  # end of the last start/end range per lane
        for step in range(steps):
            step_start = t
            stack = [("step", step_start, 0)]
            pieces = []
            for part in ("forward", "backward", "idle"):
                begin = t + rng.randint(5, 30) * US
                length = rng.randint(100, 600) * US
                pieces.append((part, begin, begin + length))
                t = begin + length
            t += rng.randint(5, 40) * US
            step_end = t
            trace.ranges.append(dict(name="step", start=step_start, end=step_end, tid=tid, depth=0, style="PushPop"))
            for part, begin, end in pieces:
                trace.ranges.append(dict(name=part, start=begin, end=end, tid=tid, depth=1, style="PushPop"))
                if part == "backward":  # a nested range, two levels down
                    inner = begin + (end - begin) // 3
                    trace.ranges.append(
                        dict(name="allreduce", start=inner, end=inner + (end - begin) // 3, tid=tid, depth=2,
                             style="PushPop")
                    )  # fmt: skip
                if part == "idle":
                    continue  # a range with no GPU work launched inside it
                for _ in range(rng.randint(2, 6)):
                    launch = rng.randint(begin, end - 1)
                    gpu = rng.choice((0, 1))
                    s = launch + rng.randint(5, 80) * US
                    kind = rng.choice(("kernel", "kernel", "kernel", "memcpy"))
                    trace.work.append(
                        dict(kind=kind, name=f"{kind}_{rng.randint(0, 3)}", start=s, end=s + rng.randint(1, 120) * US,
                             gpu=gpu, stream=rng.choice((7, 13, 14)), tid=tid, correlation=correlation, launch=launch)
                    )  # fmt: skip
                    correlation += 1
            stack.clear()
            # start/end ranges overlap each other freely; a lane is the first free at the start
            for _ in range(rng.randint(0, 2)):
                begin = rng.randint(step_start, step_end)
                end = begin + rng.randint(50, 900) * US
                lane = next((i for i, free in enumerate(lanes) if free <= begin), len(lanes))
                lanes[lane : lane + 1] = [end]
                trace.ranges.append(dict(name="async io", start=begin, end=end, tid=tid, depth=lane, style="StartEnd"))
            if step % 5 == 4:
                gpu = rng.choice((0, 1))
                last = max((w["end"] for w in trace.work if w["gpu"] == gpu), default=t)
                trace.syncs.append(dict(kind="sync", gpu=gpu, start=t, end=max(t, last) + 3 * US, tid=tid))
                t = max(t, last) + rng.randint(50, 300) * US
    # the borders of a range: launched at its start is inside it, at its end is not
    edge = max(r["end"] for r in trace.ranges) + MS
    trace.ranges.append(dict(name="edge", start=edge, end=edge + 100 * US, tid=100, depth=0, style="PushPop"))
    trace.ranges.append(dict(name="tail", start=edge + MS, end=edge + 2 * MS, tid=100, depth=0, style="PushPop"))
    for offset in (0, 100 * US):
        start = edge + offset + 5 * US
        trace.work.append(
            dict(kind="kernel", name="edge", start=start, end=start + 4 * US, gpu=1, stream=7, tid=100,
                 correlation=correlation + 100 + offset, launch=edge + offset)
        )  # fmt: skip
    for w in range(5):  # work launched outside any range
        s = t0 + rng.randint(0, 30) * MS
        trace.work.append(dict(kind="kernel", name="orphan", start=s, end=s + 40 * US, gpu=0, stream=7, tid=100,
                               correlation=correlation + w, launch=s - 10 * US))  # fmt: skip
    trace.start = min(x["start"] for x in trace.work + trace.ranges)
    trace.end = max(x["end"] for x in trace.work + trace.ranges) + 1
    for gpu in (0, 1):
        for i, ts in enumerate(range(trace.start, trace.end, 97 * US)):
            trace.samples.append(dict(gpu=gpu, ts=ts, metric="gpu.util_pct", value=float((i * 7 + gpu) % 101)))
            trace.samples.append(dict(gpu=gpu, ts=ts, metric="gpu.power_w", value=100.0 + (i % 300)))
    return trace


def store_trace(ingest: ingest_pb2_grpc.IngestStub, trace: Trace) -> None:
    builder = BatchBuilder(f"{trace.run_id}-b", run_id=trace.run_id, host=HOST)
    builder.add_run(trace.run_id, host=HOST, source="nsys", start=trace.start, end=trace.end)
    for w in trace.work:
        builder.add_events(w["kind"], [w["start"]], [w["end"]], w["name"], gpu=w["gpu"], stream=w["stream"], pid=PID,
                           tid=w["tid"], correlation_id=w["correlation"], launch_start=w["launch"])  # fmt: skip
    for r in trace.ranges:
        builder.add_events("nvtx", [r["start"]], [r["end"]], r["name"], pid=PID, tid=r["tid"], depth=r["depth"],
                           extras=[{"style": r["style"]}])  # fmt: skip
    for s in trace.syncs:
        builder.add_events(
            "sync", [s["start"]], [s["end"]], "cudaDeviceSynchronize", gpu=s["gpu"], pid=PID, tid=s["tid"]
        )
    for s in trace.samples:
        builder.add_samples(s["metric"], [s["ts"]], [s["value"]], gpu=s["gpu"])
    assert not ingest.Write(request(builder), timeout=60).duplicate
