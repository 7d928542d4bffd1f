"""A stand-in for libnvidia-ml.so: the real pynvml bindings call these functions with the
same ctypes arguments they would pass to the C library, so the agent's NVML backend runs
its real code path on a machine without a GPU. Faults are injected per GPU."""

from __future__ import annotations

import ctypes
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

OK = pynvml.NVML_SUCCESS


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 << 30
    memory_used: int = 10 << 30
    util: int = 87
    mem_util: int = 40
    sm_clock: int = 1980
    mem_clock: int = 2619
    temperature: int = 61
    throttle: int = 0
    power_mw: int = 512_345
    energy_mj: int = 9_000_000
    memory_temp: float = 70.0
    pcie_tx_kb: int = 1000
    pcie_rx_kb: int = 250_000
    sm_count: int = 132
    processes: list[tuple[int, int]] = field(default_factory=lambda: [(4242, 9 << 30)])


class _Function:
    """A library function: callable, and takes attributes as ctypes functions do (restype)."""

    def __init__(self, implementation: Any) -> None:
        self.implementation = implementation

    def __call__(self, *args: Any) -> Any:
        return self.implementation(*args)


class _Library:
    def __init__(self, fake: FakeNvml) -> None:
        self._fake = fake

    def __getattr__(self, name: str) -> _Function:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        return _Function(getattr(self._fake, name))


def _out(reference: Any) -> Any:
    """The object a byref() argument points at."""
    return reference._obj


class FakeNvml:
    def __init__(self, count: int = 2) -> None:
        self.gpus = [FakeGpu(uuid=f"GPU-fake-{i:04d}", bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(count)]
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in range(count)]
        self.lost: set[int] = set()
        self.unsupported_calls: set[tuple[str, int]] = set()  # (NVML function, gpu)
        self.unsupported_fields: set[tuple[int, int]] = set()  # (gpu, field id)
        self.failing_once: set[tuple[str, int]] = set()  # (function, gpu): NVML_ERROR_UNKNOWN once
        self.nan_memory_temp: set[int] = set()
        self.gpm_gpus: set[int] = {2}  # a Hopper among older GPUs
        self._gpm_samples: dict[int, tuple[Any, int, int]] = {}
        self.calls: Counter[tuple[str, int]] = Counter()
        self.field_requests: list[tuple[int, tuple[int, ...]]] = []

    def install(self, monkeypatch: Any) -> None:
        monkeypatch.setattr(pynvml, "nvmlLib", _Library(self))
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)

    # -- helpers ----------------------------------------------------------------------

    def _index(self, handle: Any) -> int:
        address = ctypes.addressof(handle.contents)
        for i, struct in enumerate(self._structs):
            if ctypes.addressof(struct) == address:
                return i
        raise AssertionError("unknown handle")

    def _check(self, function: str, handle: Any) -> tuple[int, int]:
        gpu = self._index(handle)
        self.calls[(function, gpu)] += 1
        if gpu in self.lost:
            return gpu, pynvml.NVML_ERROR_GPU_IS_LOST
        if (function, gpu) in self.unsupported_calls:
            return gpu, pynvml.NVML_ERROR_NOT_SUPPORTED
        if (function, gpu) in self.failing_once:
            self.failing_once.discard((function, gpu))
            return gpu, pynvml.NVML_ERROR_UNKNOWN
        return gpu, OK

    # -- the library's functions, as pynvml calls them ------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> int:
        return OK

    def nvmlShutdown(self) -> int:
        return OK

    def nvmlErrorString(self, result: int) -> bytes:
        return {
            pynvml.NVML_ERROR_GPU_IS_LOST: b"GPU is lost",
            pynvml.NVML_ERROR_NOT_SUPPORTED: b"Not Supported",
            pynvml.NVML_ERROR_UNKNOWN: b"Unknown Error",
            pynvml.NVML_ERROR_NOT_FOUND: b"Not Found",
        }.get(result, b"Fake Error")

    def nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> int:
        buffer.value = b"550.54.15"
        return OK

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        _out(count).value = len(self.gpus)
        return OK

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        if index.value in self.lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        _out(device).contents = self._structs[index.value]
        return OK

    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetUUID", handle)
        if code == OK:
            buffer.value = self.gpus[gpu].uuid.encode()
        return code

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, size: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetName", handle)
        if code == OK:
            buffer.value = self.gpus[gpu].name.encode()
        return code

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, info: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetPciInfo_v3", handle)
        if code == OK:
            _out(info).busId = self.gpus[gpu].bus_id.encode()
        return code

    def nvmlDeviceGetAttributes_v2(self, handle: Any, attributes: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetAttributes_v2", handle)
        if code == OK:
            _out(attributes).multiprocessorCount = self.gpus[gpu].sm_count
        return code

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetMemoryInfo", handle)
        if code == OK:
            fake = self.gpus[gpu]
            out = _out(memory)
            out.total, out.used, out.free = (
                fake.memory_total,
                fake.memory_used,
                fake.memory_total - fake.memory_used,
            )
        return code

    def nvmlDeviceGetUtilizationRates(self, handle: Any, utilization: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetUtilizationRates", handle)
        if code == OK:
            _out(utilization).gpu = self.gpus[gpu].util
            _out(utilization).memory = self.gpus[gpu].mem_util
        return code

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: Any, value: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetClockInfo", handle)
        if code == OK:
            fake = self.gpus[gpu]
            _out(value).value = fake.sm_clock if clock.value == pynvml.NVML_CLOCK_SM else fake.mem_clock
        return code

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, value: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetTemperature", handle)
        if code == OK:
            _out(value).value = self.gpus[gpu].temperature
        return code

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, reasons: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if code == OK:
            _out(reasons).value = self.gpus[gpu].throttle
        return code

    def nvmlDeviceGetPowerUsage(self, handle: Any, value: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetPowerUsage", handle)
        if code == OK:
            _out(value).value = self.gpus[gpu].power_mw
        return code

    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetFieldValues", handle)
        if code != OK:
            return code
        array = _out(values)
        fake = self.gpus[gpu]
        self.field_requests.append((gpu, tuple(array[i].fieldId for i in range(count.value))))
        for i in range(count.value):
            entry = array[i]
            if (gpu, entry.fieldId) in self.unsupported_fields:
                entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            entry.nvmlReturn = OK
            if entry.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                entry.valueType = pynvml.NVML_VALUE_TYPE_DOUBLE
                entry.value.dVal = math.nan if gpu in self.nan_memory_temp else fake.memory_temp
                continue
            entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            entry.value.ullVal = {
                pynvml.NVML_FI_DEV_POWER_INSTANT: fake.power_mw,
                pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: fake.energy_mj,
            }.get(entry.fieldId, 0)
        return OK

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, value: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetPcieThroughput", handle)
        if code == OK:
            fake = self.gpus[gpu]
            _out(value).value = fake.pcie_tx_kb if counter.value == pynvml.NVML_PCIE_UTIL_TX_BYTES else fake.pcie_rx_kb
        return code

    def nvmlGpmQueryDeviceSupport(self, handle: Any, support: Any) -> int:
        gpu, code = self._check("nvmlGpmQueryDeviceSupport", handle)
        if code == OK:
            _out(support).isSupportedDevice = int(gpu in self.gpm_gpus)
        return code

    def nvmlGpmSampleAlloc(self, sample: Any) -> int:
        struct = pynvml.struct_c_nvmlGpmSample_t()
        self._gpm_samples[ctypes.addressof(struct)] = (struct, -1, 0)
        _out(sample).contents = struct
        return OK

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        gpu, code = self._check("nvmlGpmSampleGet", handle)
        if code == OK:
            address = ctypes.addressof(sample.contents)
            struct, _, _ = self._gpm_samples[address]
            self._gpm_samples[address] = (struct, gpu, self.calls[("nvmlGpmSampleGet", gpu)])
        return code

    def nvmlGpmSampleFree(self, sample: Any) -> int:
        del self._gpm_samples[ctypes.addressof(sample.contents)]
        return OK

    def nvmlGpmMetricsGet(self, request: Any) -> int:
        metrics = _out(request)
        _, gpu1, n1 = self._gpm_samples[ctypes.addressof(metrics.sample1.contents)]
        _, gpu2, n2 = self._gpm_samples[ctypes.addressof(metrics.sample2.contents)]
        if gpu1 != gpu2 or n2 <= n1:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        for i in range(metrics.numMetrics):
            metrics.metrics[i].nvmlReturn = OK
            metrics.metrics[i].value = 40.0 + metrics.metrics[i].metricId
        return OK

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, processes: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetComputeRunningProcesses_v3", handle)
        if code != OK:
            return code
        running = self.gpus[gpu].processes
        if processes is None:
            _out(count).value = len(running)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if running else OK
        for i, (pid, used) in enumerate(running):
            processes[i].pid = pid
            processes[i].usedGpuMemory = used
        _out(count).value = len(running)
        return OK

    def nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count: Any, since: Any) -> int:
        gpu, code = self._check("nvmlDeviceGetProcessUtilization", handle)
        if code != OK:
            return code
        running = self.gpus[gpu].processes
        if samples is None:
            _out(count).value = len(running)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if running else pynvml.NVML_ERROR_NOT_FOUND
        for i, (pid, _) in enumerate(running):
            samples[i].pid = pid
            samples[i].timeStamp = 1_790_000_000_000_000 + self.calls[("nvmlDeviceGetProcessUtilization", gpu)]
            samples[i].smUtil = 75
            samples[i].memUtil = 30
        _out(count).value = len(running)
        return OK

    def nvmlSystemGetProcessName(self, pid: Any, buffer: Any, size: Any) -> int:
        buffer.value = f"python train.py [{pid.value}]".encode()
        return OK
