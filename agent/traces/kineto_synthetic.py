"""Synthetic PyTorch-profiler (Kineto) traces in the shape newer Kineto versions write, for tests and
benchmarks on machines without torch or a GPU.

The members before `traceEvents` (schemaVersion, deviceProperties, distributedInfo), the events,
then `traceName`, `displayTimeUnit` and `baseTimeNanoseconds` after them, with `ts` counted from
that base in µs with ns decimals (see ../shared/fixtures/kineto for real traces). Per step: a
`ProfilerStep#N` range holding `## forward ##` and `## backward ##` ranges, per kernel an aten op
with a nested one, the cudaLaunchKernel they make and its kernel on stream 7 (linked by
correlation id and an `ac2g` flow pair, the kernel written before its call as Kineto does), a
host-to-device copy, the step projected on the GPU, and a cudaDeviceSynchronize; then the
metadata events naming the process and its thread.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

BASE_NS = 1_790_000_000_000_000_000  # 2026-09-21T14:13:20Z
PID = 4242
TID = 4242
STREAM = 7
KERNELS = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, float)",
    "ampere_sgemm_128x64_tn",
    "void at::native::(anonymous namespace)::softmax_warp_forward<float, float, float, 10, false>(float*)",
)
OPS = ("aten::linear", "aten::relu", "aten::softmax")


@dataclass(frozen=True)
class KinetoSpec:
    steps: int = 20
    kernels_per_step: int = 5
    gzip: bool = True
    base_time: bool = True  # ts from baseTimeNanoseconds (in the trailer); else µs since the epoch


def events_per_step(spec: KinetoSpec) -> int:
    """Events written per step, flows included."""
    return 9 + 6 * spec.kernels_per_step


def imported_per_step(spec: KinetoSpec) -> int:
    """Events per step that become rows (not the flows)."""
    return 7 + 4 * spec.kernels_per_step


def _us(ns: int) -> str:
    """ns as µs with ns decimals, exactly."""
    return f"{ns // 1000}.{ns % 1000:03d}"


class _Writer:
    def __init__(self, out: TextIO, origin: int) -> None:
        self.out = out
        self.origin = origin  # subtracted from every time
        self.first = True
        self.count = 0

    def event(self, text: str) -> None:
        self.out.write(("\n  " if self.first else ",\n  ") + text)
        self.first = False
        self.count += 1

    def x(self, cat: str, name: str, pid: int, tid: int, start: int, dur: int, args: str) -> None:
        self.event(
            f'{{"ph": "X", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {pid}, "tid": {tid}, '
            f'"ts": {_us(start - self.origin)}, "dur": {_us(dur)}, "args": {{{args}}}}}'
        )

    def flow(self, ph: str, correlation: int, pid: int, tid: int, at: int) -> None:
        end = ', "bp": "e"' if ph == "f" else ""
        self.event(
            f'{{"ph": "{ph}", "id": {correlation}, "pid": {pid}, "tid": {tid}, '
            f'"ts": {_us(at - self.origin)}, "cat": "ac2g", "name": "ac2g"{end}}}'
        )


def write_trace(path: Path, spec: KinetoSpec = KinetoSpec()) -> int:
    """Write the trace; returns the number of events written."""
    origin = BASE_NS if spec.base_time else 0
    with _open(path, spec.gzip) as out:
        out.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {"id": 0, "name": "NVIDIA A100-SXM4-80GB", '
            '"totalGlobalMem": 85174583296, "computeMajor": 8, "computeMinor": 0, "numSms": 108}\n  ],\n'
            '  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},\n  "traceEvents": ['
        )
        writer = _Writer(out, origin)
        correlation = 1000
        at = BASE_NS + 1_000_000
        for step in range(spec.steps):
            correlation = _step(writer, spec, step, at, correlation)
            at += _step_ns(spec)
        writer.event(
            f'{{"name": "process_name", "ph": "M", "ts": {_us(BASE_NS - origin)}, "pid": {PID}, "tid": 0, '
            '"args": {"name": "python3.11"}}'
        )
        writer.event(
            f'{{"name": "thread_name", "ph": "M", "ts": {_us(BASE_NS - origin)}, "pid": {PID}, "tid": {TID}, '
            f'"args": {{"name": "thread {TID} (python3.11)"}}}}'
        )
        trailer = f',\n  "baseTimeNanoseconds": {BASE_NS}' if spec.base_time else ""
        out.write(f'\n  ],\n  "traceName": "{path.name}",\n  "displayTimeUnit": "ms"{trailer}\n}}\n')
    return writer.count


def _open(path: Path, gzipped: bool) -> TextIO:
    if gzipped:
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=1)
    return path.open("w", encoding="utf-8")


def _step_ns(spec: KinetoSpec) -> int:
    return (spec.kernels_per_step + 4) * 20_000


def _step(writer: _Writer, spec: KinetoSpec, step: int, at: int, correlation: int) -> int:
    """One step's events; returns the next correlation id."""
    length = _step_ns(spec) - 1_000
    half = length // 2
    writer.x("user_annotation", f"ProfilerStep#{step}", PID, TID, at, length, "")
    writer.x("user_annotation", "## forward ##", PID, TID, at + 10, half - 20, "")
    writer.x("user_annotation", "## backward ##", PID, TID, at + half + 10, half - 20, "")
    launches = []
    for k in range(spec.kernels_per_step):
        op_start = at + 1_000 + k * 20_000 + 123
        writer.x("cpu_op", OPS[k % len(OPS)], PID, TID, op_start, 15_000, f'"External id": {correlation + k}')
        writer.x("cpu_op", "aten::addmm", PID, TID, op_start + 1_001, 12_000, f'"External id": {correlation + k}')
        launches.append(op_start + 2_003)
    for k, launch in enumerate(launches):
        kernel = KERNELS[(step + k) % len(KERNELS)]
        gpu_start = launch + 8_007
        writer.x(
            "kernel", kernel, 0, STREAM, gpu_start, 3_000 + 7 * k + step % 5,
            f'"device": 0, "stream": {STREAM}, "correlation": {correlation}, "registers per thread": 32, '
            f'"shared memory": 0, "grid": [{64 * (k + 1)}, 1, 1], "block": [256, 1, 1], '
            f'"est. achieved occupancy %": 50',
        )  # fmt: skip
        writer.flow("f", correlation, 0, STREAM, gpu_start)
        writer.x("cuda_runtime", "cudaLaunchKernel", PID, TID, launch, 5_000, f'"correlation": {correlation}')
        writer.flow("s", correlation, PID, TID, launch)
        correlation += 1
    copy = at + length - 9_000
    writer.x("cuda_runtime", "cudaMemcpyAsync", PID, TID, copy, 4_000, f'"correlation": {correlation}')
    writer.flow("s", correlation, PID, TID, copy)
    writer.x(
        "gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 0, STREAM, copy + 2_000, 1_500,
        f'"device": 0, "stream": {STREAM}, "correlation": {correlation}, "bytes": 1048576',
    )  # fmt: skip
    writer.flow("f", correlation, 0, STREAM, copy + 2_000)
    correlation += 1
    writer.x("gpu_user_annotation", f"ProfilerStep#{step}", 0, STREAM, at + 9_000, length - 10_000, "")
    sync = at + length - 4_000
    writer.x("cuda_runtime", "cudaDeviceSynchronize", PID, TID, sync, 3_500, f'"correlation": {correlation}')
    return correlation + 1
