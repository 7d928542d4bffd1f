"""The real backend: NVIDIA's NVML through nvidia-ml-py. The only module that imports pynvml.

- Fast readings come from few calls per tick: one nvmlDeviceGetFieldValues for power,
  energy, memory temperature and ECC counts, plus utilisation, memory, clocks, temperature
  and throttle reasons. PCIe throughput (about 20 ms a call) and GPM (needs two samples a
  window apart) are slow readings, taken off the tick.
- A reading a GPU does not support is found once and never asked again.
- GPU_IS_LOST, GPU_NOT_FOUND and RESET_REQUIRED raise GpuLost for that GPU alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import pynvml

from agent.telemetry.gpu import BackendUnavailable, DeviceInfo, GpuLost, ProcessReading
from tracehouse import metrics as m

log = logging.getLogger("tracehouse.agent.nvml")
T = TypeVar("T")

LOST = {pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_GPU_NOT_FOUND, pynvml.NVML_ERROR_RESET_REQUIRED}
UNSUPPORTED = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
}
NO_DRIVER = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_UNKNOWN,
}

# field id -> (metric, scale to the metric's unit)
FIELDS: dict[int, tuple[str, float]] = {
    pynvml.NVML_FI_DEV_POWER_INSTANT: (m.GPU_POWER, 1e-3),  # mW
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (m.GPU_ENERGY, 1e-3),  # mJ
    pynvml.NVML_FI_DEV_MEMORY_TEMP: (m.GPU_MEM_TEMP, 1.0),
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (m.GPU_ECC_SBE, 1.0),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (m.GPU_ECC_DBE, 1.0),
}
GPM_METRICS: dict[int, str] = {
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: m.GPU_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: m.GPU_TENSOR_ACTIVE,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: m.GPU_DRAM_BW,
    pynvml.NVML_GPM_METRIC_SM_UTIL: m.GPU_SM_ACTIVE,
}
_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
}


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


@dataclass
class _Gpu:
    index: int
    handle: Any
    info: DeviceInfo
    fields: list[int] = field(default_factory=lambda: list(FIELDS))
    unsupported: set[str] = field(default_factory=set)
    warned: set[tuple[str, int]] = field(default_factory=set)
    gpm_previous: Any = None
    process_seen_us: int = 0


class NvmlBackend:
    name = "nvml"

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            if error.value in NO_DRIVER:
                raise BackendUnavailable(f"NVML is not available on this host ({error}; no NVIDIA driver?)") from None
            raise BackendUnavailable(f"NVML failed to start: {error}") from None
        self.driver = _text(pynvml.nvmlSystemGetDriverVersion())
        self._gpus: dict[int, _Gpu] = {}
        self.count = int(pynvml.nvmlDeviceGetCount())
        for index in range(self.count):
            try:
                self._gpus[index] = self._open(index)
            except GpuLost as lost:
                log.warning("%s; it will be retried", lost)

    def _open(self, index: int) -> _Gpu:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            info = DeviceInfo(
                index=index,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                memory_total=int(memory.total),
                sm_count=self._sm_count(handle),
                driver=self.driver,
            )
        except pynvml.NVMLError as error:
            raise GpuLost(index, str(error)) from None
        return _Gpu(index, handle, info)

    @staticmethod
    def _sm_count(handle: Any) -> int:
        try:
            return int(pynvml.nvmlDeviceGetAttributes(handle).multiprocessorCount)
        except pynvml.NVMLError:
            return 0

    def indices(self) -> list[int]:
        return list(range(self.count))

    def devices(self) -> list[DeviceInfo]:
        return [gpu.info for gpu in self._gpus.values()]

    def _gpu(self, index: int) -> _Gpu:
        gpu = self._gpus.get(index)
        if gpu is None:
            raise GpuLost(index, "not open")
        return gpu

    def _call(self, gpu: _Gpu, reading: str, call: Callable[[], T]) -> T | None:
        """Run one NVML call; None when the GPU does not support it or it failed this time."""
        if reading in gpu.unsupported:
            return None
        try:
            return call()
        except pynvml.NVMLError as error:
            self._failed(gpu, reading, error.value, str(error))
            return None

    def _failed(self, gpu: _Gpu, reading: str, code: int, text: str) -> None:
        if code in LOST:
            raise GpuLost(gpu.index, text)
        if code in UNSUPPORTED:
            gpu.unsupported.add(reading)
            log.info("GPU %d does not support %s (%s): not asking again", gpu.index, reading, text)
        elif (reading, code) not in gpu.warned:
            gpu.warned.add((reading, code))
            log.warning("GPU %d: %s failed: %s", gpu.index, reading, text)

    def read_fast(self, index: int) -> dict[str, float]:
        gpu = self._gpu(index)
        handle = gpu.handle
        out: dict[str, float] = {}
        util = self._call(gpu, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            out[m.GPU_UTIL] = util.gpu
            out[m.GPU_MEM_UTIL] = util.memory
        memory = self._call(gpu, "memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
        if memory is not None:
            out[m.GPU_MEM_USED] = memory.used
            out[m.GPU_MEM_TOTAL] = memory.total
        for reading, metric, clock in (
            ("sm clock", m.GPU_SM_CLOCK, pynvml.NVML_CLOCK_SM),
            ("memory clock", m.GPU_MEM_CLOCK, pynvml.NVML_CLOCK_MEM),
        ):
            value = self._call(gpu, reading, partial(pynvml.nvmlDeviceGetClockInfo, handle, clock))
            if value is not None:
                out[metric] = value
        temp = self._call(
            gpu, "temperature", lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        )
        if temp is not None:
            out[m.GPU_TEMP] = temp
        throttle = self._call(gpu, "throttle reasons", lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        if throttle is not None:
            out[m.GPU_THROTTLE] = throttle
        out.update(self._fields(gpu))
        if m.GPU_POWER not in out and pynvml.NVML_FI_DEV_POWER_INSTANT not in gpu.fields:
            power = self._call(gpu, "power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
            if power is not None:
                out[m.GPU_POWER] = power * 1e-3
        return out

    def _fields(self, gpu: _Gpu) -> dict[str, float]:
        if not gpu.fields:
            return {}
        values = self._call(gpu, "field values", lambda: pynvml.nvmlDeviceGetFieldValues(gpu.handle, gpu.fields))
        out: dict[str, float] = {}
        if values is None:
            return out
        for value in values:
            if value.nvmlReturn != pynvml.NVML_SUCCESS:
                if value.nvmlReturn in UNSUPPORTED:
                    gpu.fields.remove(value.fieldId)
                self._failed(gpu, f"field {value.fieldId}", value.nvmlReturn, pynvml.nvmlErrorString(value.nvmlReturn))
                continue
            member = _VALUE_MEMBER.get(value.valueType)
            if member is None:
                continue
            metric, scale = FIELDS[value.fieldId]
            out[metric] = getattr(value.value, member) * scale
        return out

    def read_slow(self, index: int) -> dict[str, float]:
        gpu = self._gpu(index)
        handle = gpu.handle
        out: dict[str, float] = {}
        for reading, metric, counter in (
            ("pcie tx", m.GPU_PCIE_TX, pynvml.NVML_PCIE_UTIL_TX_BYTES),
            ("pcie rx", m.GPU_PCIE_RX, pynvml.NVML_PCIE_UTIL_RX_BYTES),
        ):
            value = self._call(gpu, reading, partial(pynvml.nvmlDeviceGetPcieThroughput, handle, counter))
            if value is not None:
                out[metric] = value * 1024.0  # KB/s
        out.update(self._gpm(gpu))
        return out

    def _gpm(self, gpu: _Gpu) -> dict[str, float]:
        if "gpm" in gpu.unsupported:
            return {}
        if gpu.gpm_previous is None:
            support = self._call(gpu, "gpm", lambda: pynvml.nvmlGpmQueryDeviceSupport(gpu.handle))
            if support is None:
                return {}
            if not support.isSupportedDevice:
                gpu.unsupported.add("gpm")
                return {}
        sample = self._call(gpu, "gpm", lambda: pynvml.nvmlGpmSampleGet(gpu.handle, pynvml.nvmlGpmSampleAlloc()))
        if sample is None:
            return {}
        previous, gpu.gpm_previous = gpu.gpm_previous, sample
        if previous is None:
            return {}
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = previous
        request.sample2 = sample
        for i, metric_id in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric_id
        answer = self._call(gpu, "gpm metrics", lambda: pynvml.nvmlGpmMetricsGet(request))
        self._call(gpu, "gpm free", lambda: pynvml.nvmlGpmSampleFree(previous))
        if answer is None:
            return {}
        return {
            GPM_METRICS[answer.metrics[i].metricId]: answer.metrics[i].value
            for i in range(len(GPM_METRICS))
            if answer.metrics[i].nvmlReturn == pynvml.NVML_SUCCESS and answer.metrics[i].metricId in GPM_METRICS
        }

    def processes(self, index: int) -> list[ProcessReading]:
        gpu = self._gpu(index)
        running = self._call(gpu, "processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(gpu.handle))
        if not running:
            return []
        utilisation: dict[int, tuple[float, float]] = {}
        if "process utilization" not in gpu.unsupported:
            try:
                for sample in pynvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.process_seen_us):
                    utilisation[sample.pid] = (float(sample.smUtil), float(sample.memUtil))
                    gpu.process_seen_us = max(gpu.process_seen_us, int(sample.timeStamp))
            except pynvml.NVMLError as error:
                if error.value != pynvml.NVML_ERROR_NOT_FOUND:  # no sample since last time
                    self._failed(gpu, "process utilization", error.value, str(error))
        readings = []
        for process in running:
            sm, mem = utilisation.get(process.pid, (None, None))
            readings.append(
                ProcessReading(
                    pid=int(process.pid),
                    name=self._process_name(process.pid),
                    gpu_mem_bytes=None if process.usedGpuMemory is None else float(process.usedGpuMemory),
                    sm_util_pct=sm,
                    mem_util_pct=mem,
                )
            )
        return readings

    @staticmethod
    def _process_name(pid: int) -> str:
        try:
            return _text(pynvml.nvmlSystemGetProcessName(pid))
        except pynvml.NVMLError:
            return ""

    def reopen(self, index: int) -> DeviceInfo:
        gpu = self._open(index)
        self._gpus[index] = gpu
        return gpu.info

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.debug("nvmlShutdown: %s", error)
