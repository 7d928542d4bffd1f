"""A synthetic distributed job with a known truth: ranks on hosts, steps of data loading, compute kernels
and an NCCL all-reduce that ends on every rank together; one rank slowed by a known amount over a known
step range (in its compute or its data loading), its GPU throttled meanwhile (a simulated agent's
samples); a host's clock set apart by a known offset."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracehouse.batch import BatchBuilder

T0 = 1_790_000_000_000_000_000
MS = 1_000_000
DATA_NS = 5 * MS
COMPUTE_NS = 60 * MS
TRANSFER_NS = 10 * MS
ALLREDUCE_BYTES = 64 << 20
KERNELS = 4


@dataclass
class JobSpec:
    job: str = "job-1"
    ranks: int = 8
    per_host: int = 4
    steps: int = 40
    slow_rank: int | None = 5
    slow_steps: tuple[int, int] = (10, 19)  # inclusive
    slow_ns: int = 20 * MS
    slow_part: str = "compute"  # or data
    host_offsets_ns: dict[int, int] = field(default_factory=lambda: {1: 50 * MS})  # host index -> clock offset
    no_trace: tuple[int, ...] = ()  # ranks with a run but no events
    missing_steps: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> steps it lacks (inclusive)
    noise_ns: int = 300_000
    second_ns: int = 3 * MS  # rank 1 is this much slower all along: under the threshold, but the what-if counts it
    seed: int = 0


@dataclass
class Truth:
    lost_ns: int  # what the slow rank cost the job
    step_ends: np.ndarray  # true time of each step's end


def host_of(spec: JobSpec, rank: int) -> str:
    return f"node-{rank // spec.per_host}"


def build(spec: JobSpec) -> tuple[list[BatchBuilder], Truth]:
    rng = np.random.default_rng(spec.seed)
    compute = COMPUTE_NS + rng.integers(-spec.noise_ns, spec.noise_ns + 1, size=(spec.steps, spec.ranks))
    data = np.full((spec.steps, spec.ranks), DATA_NS, np.int64)
    if spec.ranks > 2:
        compute[:, 1] += spec.second_ns
    lost = 0
    if spec.slow_rank is not None:
        first, last = spec.slow_steps
        target = compute if spec.slow_part == "compute" else data
        target[first : last + 1, spec.slow_rank] += spec.slow_ns
    own = data + compute
    for s in range(spec.steps):
        others = np.delete(own[s], spec.slow_rank) if spec.slow_rank is not None else own[s]
        if spec.slow_rank is not None:
            lost += max(0, int(own[s, spec.slow_rank] - max(others.max(), np.median(own[s]))))
    builders = []
    t = T0
    starts = np.zeros(spec.steps, np.int64)
    ends = np.zeros(spec.steps, np.int64)
    for s in range(spec.steps):
        starts[s] = t
        ends[s] = t + own[s].max() + TRANSFER_NS
        t = ends[s]
    for rank in range(spec.ranks):
        host = host_of(spec, rank)
        offset = spec.host_offsets_ns.get(rank // spec.per_host, 0)
        run_id = f"{spec.job}-rank{rank}"
        attrs = {
            "job": spec.job,
            "rank": str(rank),
            "world_size": str(spec.ranks),
            "local_rank": str(rank % spec.per_host),
        }
        b = BatchBuilder(f"{run_id}/run", run_id=run_id, host=host)
        b.add_run(
            run_id, name=f"train-r{rank}", host=host, start=int(T0 + offset), end=int(ends[-1] + offset), attrs=attrs
        )
        builders.append(b)
        if rank in spec.no_trace:
            continue
        lacking = spec.missing_steps.get(rank)
        keep = np.ones(spec.steps, bool)
        if lacking:
            keep[lacking[0] : lacking[1] + 1] = False
        e = BatchBuilder(f"{run_id}/events", run_id=run_id, host=host)
        st = starts + offset
        en = ends + offset
        e.add_events("step", st[keep], en[keep], "step", extras=[{"step": str(s)} for s in np.flatnonzero(keep)], tid=1)
        e.add_events("phase", st[keep], (st + data[:, rank])[keep], "data", tid=1, depth=1)
        k0 = st + data[:, rank]
        piece = compute[:, rank] // KERNELS
        gpu = rank % spec.per_host
        for k in range(KERNELS):
            e.add_events("kernel", (k0 + k * piece)[keep], (k0 + (k + 1) * piece)[keep], f"gemm_{k}", gpu=gpu, stream=7)
        arrive = k0 + compute[:, rank]
        e.add_events("kernel", arrive[keep], en[keep], "ncclDevKernel_AllReduce_Sum_f32_RING_LL", gpu=gpu, stream=9,
                     bytes=ALLREDUCE_BYTES)  # fmt: skip
        builders.append(e)
        # a simulated agent's telemetry, on the host's clock: 10 Hz over the job
        ts = np.arange(T0, ends[-1], 100 * MS) + offset
        clock = np.full(ts.size, 1980.0)
        throttle = np.zeros(ts.size)
        temp = np.full(ts.size, 60.0)
        if rank == spec.slow_rank:
            first, last = spec.slow_steps
            inside = (ts >= starts[first] + offset) & (ts < ends[last] + offset)
            clock[inside], throttle[inside], temp[inside] = 1100.0, float(0x40), 91.0
        a = BatchBuilder(f"{run_id}/samples", run_id=f"agent-{host}", host=host)
        a.add_samples("gpu.sm_clock_mhz", ts, clock, gpu=gpu)
        a.add_samples("gpu.throttle_reasons", ts, throttle, gpu=gpu)
        a.add_samples("gpu.temp_c", ts, temp, gpu=gpu)
        builders.append(a)
    return builders, Truth(lost, ends)
