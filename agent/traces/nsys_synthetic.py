"""Schema-faithful synthetic Nsight Systems exports, in the shapes of several nsys versions,
for tests, benchmarks and demos on machines without a GPU.

The workload is a training loop: per step an NVTX push/pop `train_step` with nested
`forward` and `backward` ranges, a host-to-device copy of the batch, kernel launches
(cudaLaunchKernel with their kernels on the GPU, linked by correlation id), and a
cudaDeviceSynchronize. Column sets and orders follow the real exports of each version
(see ../shared/fixtures/nsys for real ones).
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

SHAPES = ("2021.2", "2022.4", "2026.1")
SESSION_START_NS = 1_790_000_000_000_000_000
PID = 4242
MAIN_TID = 4242
CUPTI_TID = 4250
KERNELS = (
    "void gemm_kernel<float, 128, 128>(const float *, const float *, float *, int, int, int)",
    "void relu_kernel<float>(float *, int)",
    "void softmax_kernel<float, 1024>(const float *, float *, int)",
    "void layernorm_kernel<float>(const float *, float *, const float *, int)",
    "void adam_update(float *, const float *, float *, float *, float, int)",
)
RUNTIME_NAMES = (
    "cudaLaunchKernel_v7000", "cudaMemcpyAsync_v3020", "cudaDeviceSynchronize_v3020", "cudaMalloc_v3020",
)  # fmt: skip


def global_tid(pid: int, tid: int) -> int:
    return (1 << 48) | (pid << 24) | tid


def global_pid(pid: int) -> int:
    return (1 << 48) | (pid << 24)


@dataclass(frozen=True)
class Gpu:
    """The profiled GPU, as TARGET_INFO_GPU describes it (device 0)."""

    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = "GPU-7c5a4e9b-0000-4000-8000-00000000a100"
    bus: str = "0000:07:00.0"
    memory: int = 85899345920
    sm_count: int = 108
    chip: str = "GA100"
    compute: tuple[int, int] = (8, 0)  # capability major, minor


@dataclass(frozen=True)
class Spec:
    shape: str = "2026.1"
    steps: int = 20
    kernels_per_step: int = 5
    gpu_metrics: bool = True
    seed: int = 7
    start_ns: int = SESSION_START_NS  # the session's start, ns since the epoch
    time_scale: int = 1  # every time from the session's start multiplied: 1000 makes µs steps ms steps
    pid: int = PID  # the profiled process (its main thread has the same id)
    hostname: str = "gpu-node-7"
    gpu: Gpu = Gpu()


# the leading columns of each table that are times from the session's start
TIME_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_RUNTIME": 2,
    "CUPTI_ACTIVITY_KIND_KERNEL": 2,
    "CUPTI_ACTIVITY_KIND_MEMCPY": 2,
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": 2,
    "NVTX_EVENTS": 2,
    "OSRT_API": 2,
    "GPU_METRICS": 1,
}


def _dilated(rows: Iterable[tuple[object, ...]], columns: int, scale: int) -> Iterator[tuple[object, ...]]:
    for row in rows:
        yield tuple(v * scale if i < columns and isinstance(v, int) else v for i, v in enumerate(row))


def _columns(shape: str) -> dict[str, str]:
    """CREATE TABLE bodies per table, as the given version writes them."""
    green = "greenContextId INTEGER, " if shape == "2026.1" else ""
    mangled = "mangledName INTEGER, " if shape != "2021.2" else ""
    kernel_extra = (
        ", qmdBulkReleaseDone INTEGER, qmdPreexitDone INTEGER, qmdLastCtaDone INTEGER, graphId INTEGER, "
        "clusterX INTEGER, clusterY INTEGER, clusterZ INTEGER, clusterSchedulingPolicy INTEGER, "
        "maxPotentialClusterSize INTEGER, maxActiveClusters INTEGER, sharedMemoryRequestedPercentage INTEGER"
        if shape == "2026.1"
        else ""
    )
    sync_type = (
        "deprecatedSyncType INTEGER, syncType INTEGER NOT NULL" if shape == "2026.1" else "syncType INTEGER NOT NULL"
    )
    osrt = (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, "
        + ("correlationId INTEGER, " if shape == "2021.2" else "")
        + "nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, nestingLevel INTEGER, callchainId INTEGER NOT NULL"
    )
    return {
        "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
        "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
        "TARGET_INFO_GPU": (
            "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER, "
            "l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, smCount INTEGER, "
            "pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER, computeMajor INTEGER, "
            "computeMinor INTEGER"
        ),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (
            "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, "
            "correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER"
        ),
        "CUPTI_ACTIVITY_KIND_KERNEL": (
            f"start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
            f"{green}streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
            f"demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, {mangled}launchType INTEGER, "
            "cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, "
            "gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
            "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, "
            "localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, "
            f"sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER{kernel_extra}"
        ),
        "CUPTI_ACTIVITY_KIND_MEMCPY": (
            f"start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
            f"{green}streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
            "bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, "
            "dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, "
            "migrationCause INTEGER, graphNodeId INTEGER"
        ),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
            f"start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
            f"{green}streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, {sync_type}, "
            "eventId INTEGER NOT NULL"
        ),
        "NVTX_EVENTS": (
            "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER, "
            "color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, "
            "uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, "
            "floatValue REAL, jsonTextId INTEGER, jsonText TEXT"
        ),
        "OSRT_API": osrt,
        "GPU_METRICS": "timestamp INTEGER, typeId INTEGER NOT NULL, metricId INTEGER NOT NULL, value INTEGER NOT NULL",
        "TARGET_INFO_GPU_METRICS": (
            "typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, typeName TEXT NOT NULL, metricId INTEGER NOT NULL, "
            "metricName TEXT NOT NULL"
        ),
        "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT"
        + (", systemClockNs INTEGER" if shape == "2026.1" else ""),
        "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
        "TARGET_INFO_SYSTEM_ENV": "globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, "
        "nameEnum INTEGER NOT NULL, value TEXT NOT NULL",
        "META": "name TEXT NOT NULL, value TEXT",
        "ENUM_CUDA_MEMCPY_OPER": "id INTEGER, name TEXT, label TEXT",
    }


class _Strings:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids))


def write_export(path: Path, spec: Spec = Spec()) -> dict[str, int]:
    """Write an export; returns the rows written per table."""
    if spec.shape not in SHAPES:
        raise ValueError(f"shape {spec.shape!r}: one of {SHAPES}")
    path.unlink(missing_ok=True)
    columns = _columns(spec.shape)
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA journal_mode = OFF")
    connection.execute("PRAGMA synchronous = OFF")
    strings = _Strings()
    tables = ["StringIds", "ThreadNames", "TARGET_INFO_GPU", "CUPTI_ACTIVITY_KIND_RUNTIME",
              "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
              "NVTX_EVENTS", "OSRT_API"]  # fmt: skip
    if spec.shape != "2021.2":
        tables += ["TARGET_INFO_SESSION_START_TIME", "PROCESSES", "TARGET_INFO_SYSTEM_ENV"]
    if spec.shape == "2026.1" and spec.gpu_metrics:
        tables += ["GPU_METRICS", "TARGET_INFO_GPU_METRICS"]
    for table in tables:
        connection.execute(f"CREATE TABLE {table} ({columns[table]})")
    counts: dict[str, int] = {}

    def insert(table: str, rows: Iterable[tuple[object, ...]], into: str = "") -> None:
        width = len(columns[table].split(", "))
        if spec.time_scale != 1 and table in TIME_COLUMNS:
            rows = _dilated(rows, TIME_COLUMNS[table], spec.time_scale)
        cursor = connection.executemany(f"INSERT INTO {into or table} VALUES ({', '.join('?' * width)})", rows)
        counts[into or table] = counts.get(into or table, 0) + cursor.rowcount

    workload = _Workload(spec, strings)
    insert("CUPTI_ACTIVITY_KIND_RUNTIME", workload.runtime())
    insert("CUPTI_ACTIVITY_KIND_KERNEL", workload.kernels())
    insert("CUPTI_ACTIVITY_KIND_MEMCPY", workload.memcpy())
    insert("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", workload.syncs())
    insert("NVTX_EVENTS", workload.nvtx())
    insert("OSRT_API", workload.osrt())
    if "GPU_METRICS" in tables:
        metrics = [(0x10000, 0, spec.gpu.chip, 1, "SMs Active [Throughput %]"),
                   (0x10000, 0, spec.gpu.chip, 2, "DRAM Read Bandwidth [Throughput %]")]  # fmt: skip
        insert("TARGET_INFO_GPU_METRICS", metrics)
        insert("GPU_METRICS", workload.gpu_metrics())
    cupti_tid = spec.pid + CUPTI_TID - MAIN_TID
    insert("ThreadNames", [(strings("python"), 0, global_tid(spec.pid, spec.pid)),
                           (strings("CUPTI worker thread"), 10, global_tid(spec.pid, cupti_tid))])  # fmt: skip
    gpu = spec.gpu
    insert("TARGET_INFO_GPU", [(0, 0, gpu.name, gpu.bus, 1, 41943040, gpu.memory, 2039000000000, 1410000, gpu.sm_count,
                                0, gpu.uuid, 0, gpu.chip, 0, *gpu.compute)])  # fmt: skip
    if spec.shape != "2021.2":
        started = datetime.fromtimestamp(spec.start_ns // 1_000_000_000, tz=UTC)
        insert("TARGET_INFO_SESSION_START_TIME", [
            (spec.start_ns, f"{started:%Y-%m-%dT%H:%M:%S}Z", f"{started:%Y-%m-%dT%H:%M:%S}")
            + ((123_456_789,) if spec.shape == "2026.1" else ())
        ])  # fmt: skip
        insert("PROCESSES", [(global_pid(spec.pid), spec.pid, "python train.py"), (global_pid(1), 1, "systemd")])
        insert("TARGET_INFO_SYSTEM_ENV", [(0, "Sys", "Hostname", 1, spec.hostname)])
        meta = "META_DATA_EXPORT" if spec.shape == "2026.1" else "EXPORT_META_DATA"
        version = {"2022.4": "2022.4.2.1", "2026.1": "2026.1.1.204"}[spec.shape]
        connection.execute(f"CREATE TABLE {meta} ({columns['META']})")
        insert("META", [("EXPORT_PRODUCT_VERSION", version), ("EXPORT_SCHEMA_VERSION", "3.0.0")], into=meta)
        connection.execute(f"CREATE TABLE ENUM_CUDA_MEMCPY_OPER ({columns['ENUM_CUDA_MEMCPY_OPER']})")
        insert("ENUM_CUDA_MEMCPY_OPER", [(1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device")])
    else:
        strings("/opt/nvidia/nsight-systems/2021.2.1/target-linux-x64/libToolsInjection64.so")
    insert("StringIds", [(i, text) for text, i in strings.ids.items()])
    connection.commit()
    connection.close()
    return counts


class _Workload:
    def __init__(self, spec: Spec, strings: _Strings) -> None:
        self.spec = spec
        self.strings = strings
        self.random = random.Random(spec.seed)
        self.steps = []  # (step start, step end, [(call start, call end, correlation, kernel index, gpu start)])
        t = 2_000_000
        correlation = 1
        for _ in range(spec.steps):
            step_start = t
            t += 30_000  # memcpy launch
            launches = []
            for k in range(spec.kernels_per_step):
                call = t + self.random.randint(2_000, 4_000)
                launches.append((call, call + 3_500, correlation, k % len(KERNELS), call + 8_000 + k * 40_000))
                correlation += 1
                t = call + 3_500
            last_kernel_end = launches[-1][4] + 35_000 if launches else t
            sync_start = t + 1_000
            t = max(last_kernel_end, sync_start) + 2_000
            self.steps.append((step_start, t, launches, correlation, sync_start))
            correlation += 2
            t += self.random.randint(100_000, 300_000)  # the data loader

    def runtime(self) -> Iterator[tuple[object, ...]]:
        launch, copy, sync = (self.strings(n) for n in RUNTIME_NAMES[:3])
        tid = global_tid(self.spec.pid, self.spec.pid)
        for step_start, step_end, launches, correlation, sync_start in self.steps:
            yield (step_start + 1_000, step_start + 9_000, 0, tid, correlation, copy, 0, None)
            for call, call_end, corr, _, _ in launches:
                yield (call, call_end, 0, tid, corr, launch, 0, None)
            yield (sync_start, step_end - 1_000, 0, tid, correlation + 1, sync, 0, None)

    def kernels(self) -> Iterator[tuple[object, ...]]:
        names = [(self.strings(k), self.strings(k.split("(")[0].split("<")[0].split()[-1])) for k in KERNELS]
        mangled = self.spec.shape != "2021.2"
        extra = (None,) * 11 if self.spec.shape == "2026.1" else ()
        green = (0,) if self.spec.shape == "2026.1" else ()
        for _, _, launches, _, _ in self.steps:
            for _, _, corr, k, start in launches:
                demangled, short = names[k]
                duration = 20_000 + 3_000 * k + self.random.randint(0, 2_000)
                yield (start, start + duration, 0, 1, *green, 7, corr, global_pid(self.spec.pid), demangled, short,
                       *((self.strings(f"_Z{k}kernelv"),) if mangled else ()), 1, 1, 32 + 8 * k, 128, 1, 1, 256, 1,
                       1, 0, 4096 * k, 0, 0, corr, None, None, 0, *extra)  # fmt: skip

    def memcpy(self) -> Iterator[tuple[object, ...]]:
        process = global_pid(self.spec.pid)
        green = (0,) if self.spec.shape == "2026.1" else ()
        for step_start, _, _, correlation, _ in self.steps:
            start = step_start + 12_000
            yield (start, start + 15_000, 0, 1, *green, 7, correlation, process, 4 << 20, 1, None, 1, 2,
                   None, None, 0, 1, None, None)  # fmt: skip

    def syncs(self) -> Iterator[tuple[object, ...]]:
        process = global_pid(self.spec.pid)
        green = (0,) if self.spec.shape == "2026.1" else ()
        kind = (None, 4) if self.spec.shape == "2026.1" else (1,)
        for _, step_end, _, correlation, sync_start in self.steps:
            yield (sync_start + 500, step_end - 1_500, 0, 1, *green, 4294967295, correlation + 1, process,
                   *kind, 4294967295)  # fmt: skip

    def nvtx(self) -> Iterator[tuple[object, ...]]:
        tid = global_tid(self.spec.pid, self.spec.pid)
        step_name = self.strings("train_step")
        yield (-5_000, None, 75, None, None, None, "trainer", tid, None, None, 1, *([None] * 8))
        for i, (start, end, launches, _, _) in enumerate(self.steps):
            middle = launches[len(launches) // 2][0] if launches else (start + end) // 2
            yield (start, end, 59, None, None, 0xFF76B900, None, tid, None, step_name, 0, *([None] * 8))
            yield (start + 100, middle, 59, None, None, None, "forward", tid, None, None, 0, *([None] * 8))
            yield (middle, end - 100, 59, None, None, None, "backward", tid, None, None, 0, *([None] * 8))
            yield (
                start + 200,
                start + 200,
                34,
                None,
                None,
                None,
                f"batch {i}",
                tid,
                None,
                None,
                0,
                *([None] * 8),
            )
            yield (start, end, 60, i, None, None, "step", tid, None, None, 1, *([None] * 8))

    def osrt(self) -> Iterator[tuple[object, ...]]:
        poll, ioctl = self.strings("poll"), self.strings("ioctl")
        tid = global_tid(self.spec.pid, self.spec.pid + CUPTI_TID - MAIN_TID)
        with_correlation = self.spec.shape == "2021.2"
        for step_start, _, _, _, _ in self.steps:
            yield (
                step_start + 500,
                step_start + 40_000,
                27,
                tid,
                *((0,) if with_correlation else ()),
                poll,
                0,
                0,
                0,
            )
            yield (
                step_start + 600,
                step_start + 900,
                27,
                tid,
                *((0,) if with_correlation else ()),
                ioctl,
                0,
                1,
                0,
            )

    def gpu_metrics(self) -> Iterator[tuple[object, ...]]:
        first, last = self.steps[0][0], self.steps[-1][1]
        step = 0  # the steps are in time order and apart: the first that has not ended by ts
        for ts in range(first, last, 100_000):
            while self.steps[step][1] <= ts:
                step += 1
            busy = self.steps[step][0] <= ts
            yield (ts, 0x10000, 1, 90 if busy else 5)
            yield (ts, 0x10000, 2, 40 if busy else 1)
