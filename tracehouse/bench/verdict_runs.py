"""Synthetic training runs with known truth, for `bench verdict` and its tests: per step the host
loads data (no GPU work), launches a copy and three kernels and waits for them in a synchronise
call. Every duration varies from step to step (lognormal), every run is a little faster or
slower than its neighbours (a run effect: clocks, placement), the first steps are slow (warm-up),
and a change can be injected: one kernel longer, or a data-loading stall every Nth step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracehouse.batch import BatchBuilder
from tracehouse.metrics import GPU_ENERGY, GPU_UTIL

KERNELS = {"sgemm_128x64_nn": 6_000_000, "relu_fwd": 1_000_000, "nccl_allreduce_ring": 2_000_000}
COPY_NS = 500_000
LOAD_NS = 2_000_000
LAUNCH_NS = 8_000  # a launch call on the host; the kernels start this long apart at least
PID, TID = 4242, 4243
WARMUP_STEPS = 4
WARMUP_FACTOR = 3.0
WATTS = 300.0


@dataclass(frozen=True)
class RunShape:
    steps: int = 100
    step_sd: float = 0.01  # lognormal sd of each duration, step to step
    run_sd: float = 0.002  # lognormal sd of a run's durations, run to run
    longer: dict[str, float] = field(default_factory=dict)  # kernel -> relative change (0.03: 3 % longer)
    stall_every: int = 0  # every Nth step the data loading stalls...
    stall_ns: int = 0  # ...this much longer
    batch: int = 256
    warmup: bool = True


@dataclass(frozen=True)
class TrueSteps:
    """What the generator made: per step the loading time, each kernel's time, and the step's length."""

    step_ns: np.ndarray
    kernel_ns: dict[str, np.ndarray]


def synthetic_run(
    run_id: str, seed: int, t0: int, shape: RunShape, host: str = "bench-host"
) -> tuple[BatchBuilder, TrueSteps]:
    """One run as a batch (the run, its steps, GPU work on GPU 0, CUDA API calls, telemetry of GPU 0)."""
    rng = np.random.default_rng(seed)
    n = shape.steps
    scale = np.exp(rng.normal(0, shape.run_sd)) * np.exp(rng.normal(0, shape.step_sd, size=(n, 2 + len(KERNELS))))
    if shape.warmup:
        scale[:WARMUP_STEPS] *= WARMUP_FACTOR
    load = LOAD_NS * scale[:, 0]
    if shape.stall_every:
        load[shape.stall_every - 1 :: shape.stall_every] += shape.stall_ns
    copy = COPY_NS * scale[:, 1]
    kernels = {name: base * (1 + shape.longer.get(name, 0.0)) * scale[:, 2 + i]
               for i, (name, base) in enumerate(KERNELS.items())}  # fmt: skip
    load, copy = load.astype(np.int64), copy.astype(np.int64)
    kernels = {name: values.astype(np.int64) for name, values in kernels.items()}
    gpu_ns = copy + sum(kernels.values()) + LAUNCH_NS * (len(KERNELS) + 1)
    step_ns = load + gpu_ns + LAUNCH_NS
    starts = t0 + np.concatenate([[0], np.cumsum(step_ns)[:-1]])
    builder = BatchBuilder(f"{run_id}/1", run_id=run_id, host=host)
    end = int(starts[-1] + step_ns[-1])
    builder.add_run(run_id, name=run_id, host=host, source="user", start=t0, end=end,
                    tags={"batch": str(shape.batch)})  # fmt: skip
    builder.add_events("step", starts, starts + step_ns, "step", pid=PID, tid=TID,
                       extras=[{"step": str(i)} for i in range(n)])  # fmt: skip
    at = starts + load  # the host starts launching
    builder.add_events("phase", starts, at, "data", pid=PID, tid=TID, depth=1)
    builder.add_events("phase", at, starts + step_ns, "compute", pid=PID, tid=TID, depth=1)
    work_start = at + LAUNCH_NS
    builder.add_events("cuda_api", at, at + LAUNCH_NS, "cudaMemcpyAsync", pid=PID, tid=TID)
    builder.add_events("memcpy", work_start, work_start + copy, "[CUDA memcpy HtoD]", gpu=0, stream=7, pid=PID,
                       tid=TID, launch_start=at, bytes=1 << 20)  # fmt: skip
    cursor = work_start + copy
    for i, (name, length) in enumerate(kernels.items()):
        launch = at + LAUNCH_NS * (i + 1)
        builder.add_events("cuda_api", launch, launch + LAUNCH_NS, "cudaLaunchKernel", pid=PID, tid=TID)
        begin = np.maximum(cursor, launch + LAUNCH_NS)
        builder.add_events(
            "kernel", begin, begin + length, name, gpu=0, stream=7, pid=PID, tid=TID, launch_start=launch
        )
        cursor = begin + length
    sync_from = at + LAUNCH_NS * (len(KERNELS) + 1)
    builder.add_events("cuda_api", sync_from, np.maximum(cursor, sync_from + 1), "cudaStreamSynchronize", pid=PID,
                       tid=TID)  # fmt: skip
    ticks = np.arange(t0, end, 100_000_000, dtype=np.int64)
    builder.add_samples(GPU_ENERGY, ticks, WATTS * (ticks - t0) / 1e9, gpu=0)
    builder.add_samples(GPU_UTIL, ticks, np.full(len(ticks), 90.0), gpu=0)
    return builder, TrueSteps(step_ns, kernels)
