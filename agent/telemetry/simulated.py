"""The simulated backend: N GPUs with plausible, time-varying telemetry, for hosts without
a GPU (demos, tests, benchmarks).

Each GPU runs a training loop: a step of ~0.6 s computes at ~95 % for about 80 % of it and
waits for the data loader the rest, when utilisation falls and PCIe traffic rises. Power
follows utilisation, temperature follows power with a lag, clocks sag as it warms, energy
integrates power, memory fills up during the first minute. Readings are a pure function of
(GPU, time), so every run of a test sees the same telemetry at the same instants.

Processes on a simulated GPU: the backend's own process (the simulated training), and any
process that declared its use with `use_gpu()` (a file in `$TRACEHOUSE_HOME/simulated-gpus`,
the simulated cudaMalloc) while it is alive.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from agent.telemetry.gpu import DeviceInfo, GpuLost, ProcessReading
from tracehouse import config
from tracehouse import metrics as m
from tracehouse.regularfile import read_regular

GIB = 1 << 30
MEMORY = 80 * GIB
IDLE_W, PEAK_W = 70.0, 700.0
STEP_S = 0.6
COMPUTE_SHARE = 0.8


def declarations_folder() -> Path:
    return config.home() / "simulated-gpus"


def use_gpu(gpu: int, memory_bytes: int, sm_pct: float = 50.0, folder: Path | None = None) -> Path:
    """Declare that this process uses `memory_bytes` of simulated GPU `gpu` at `sm_pct` %
    (until it exits, or calls again): what cudaMalloc and kernels would show NVML."""
    folder = folder or declarations_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}.{gpu}.json"
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps({"memory_bytes": int(memory_bytes), "sm_pct": float(sm_pct)}))
    partial.replace(path)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _phase(gpu: int, t: float) -> float:
    """Where in its training step a GPU is at t, in [0, 1)."""
    step = STEP_S * (1 + 0.05 * gpu)
    return ((t + 0.13 * gpu) / step) % 1.0


def _busy(gpu: int, t: float) -> float:
    """0..1: how much of the GPU the workload uses at t."""
    if _phase(gpu, t) < COMPUTE_SHARE:
        return 0.93 + 0.05 * math.sin(7.3 * t + gpu)
    return 0.08 + 0.04 * math.sin(3.1 * t)


class SimulatedBackend:
    name = "simulated"

    def __init__(
        self,
        count: int,
        clock: Callable[[], float] = time.time,
        started: float | None = None,
        declarations: Path | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("simulate at least one GPU")
        self.count = count
        self.clock = clock
        self.started = clock() if started is None else started
        self.declarations = declarations or declarations_folder()
        self._pid = os.getpid()

    def indices(self) -> list[int]:
        return list(range(self.count))

    def devices(self) -> list[DeviceInfo]:
        return [self._info(i) for i in range(self.count)]

    def _info(self, gpu: int) -> DeviceInfo:
        return DeviceInfo(
            index=gpu,
            uuid=f"GPU-5151{gpu:04x}-0000-4000-8000-{gpu:012x}",
            pci_bus_id=f"00000000:{0x18 + 0x10 * gpu:02X}:00.0",
            name="Simulated H100 80GB HBM3",
            memory_total=MEMORY,
            sm_count=132,
            driver="simulated",
            attrs={"simulated": "true"},
        )

    def read_fast(self, gpu: int) -> dict[str, float]:
        self._check(gpu)
        t = self.clock()
        busy = _busy(gpu, t)
        elapsed = max(0.0, t - self.started)
        warm = 1.0 - math.exp(-elapsed / 90.0)
        temperature = 34.0 + 40.0 * warm * (0.6 + 0.4 * busy)
        power = IDLE_W + (PEAK_W - IDLE_W) * busy
        used = MEMORY * (0.05 + 0.8 * min(1.0, elapsed / 60.0))
        return {
            m.GPU_UTIL: round(100.0 * busy),
            m.GPU_MEM_UTIL: round(70.0 * busy),
            m.GPU_MEM_USED: float(int(used)),
            m.GPU_MEM_TOTAL: float(MEMORY),
            m.GPU_POWER: round(power, 3),
            m.GPU_ENERGY: round(elapsed * (IDLE_W + (PEAK_W - IDLE_W) * 0.76), 3),
            m.GPU_TEMP: round(temperature),
            m.GPU_MEM_TEMP: round(temperature + 6.0),
            m.GPU_SM_CLOCK: float(1980 - int(3 * max(0.0, temperature - 60.0))),
            m.GPU_MEM_CLOCK: 2619.0,
            m.GPU_THROTTLE: 0.0 if temperature < 72 else 32.0,  # sw thermal slowdown
            m.GPU_ECC_SBE: 0.0,
            m.GPU_ECC_DBE: 0.0,
        }

    def read_slow(self, gpu: int) -> dict[str, float]:
        self._check(gpu)
        t = self.clock()
        loading = _phase(gpu, t) >= COMPUTE_SHARE
        busy = _busy(gpu, t)
        return {
            m.GPU_PCIE_RX: (9.0e9 if loading else 4.0e8) * (1 + 0.1 * math.sin(t)),
            m.GPU_PCIE_TX: 2.0e8 * (1 + 0.1 * math.cos(t)),
            m.GPU_SM_OCCUPANCY: round(55.0 * busy, 2),
            m.GPU_TENSOR_ACTIVE: round(60.0 * busy, 2),
            m.GPU_DRAM_BW: round(45.0 * busy, 2),
            m.GPU_SM_ACTIVE: round(90.0 * busy, 2),
        }

    def processes(self, gpu: int) -> list[ProcessReading]:
        self._check(gpu)
        busy = _busy(gpu, self.clock())
        own = ProcessReading(
            pid=self._pid,
            name="python train.py (simulated)",
            gpu_mem_bytes=float(self.read_fast(gpu)[m.GPU_MEM_USED] - GIB),
            sm_util_pct=round(100.0 * busy),
            mem_util_pct=round(70.0 * busy),
        )
        return [own, *self._declared(gpu)]

    def _declared(self, gpu: int) -> list[ProcessReading]:
        readings = []
        for path in sorted(self.declarations.glob(f"*.{gpu}.json")) if self.declarations.is_dir() else []:
            try:
                pid = int(path.name.split(".")[0])
                use = json.loads(read_regular(path, 4096))
                memory, sm = float(use["memory_bytes"]), float(use["sm_pct"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written, or not a declaration
            if pid == self._pid:
                continue
            if not _alive(pid):
                path.unlink(missing_ok=True)
                continue
            readings.append(ProcessReading(pid=pid, name="", gpu_mem_bytes=memory, sm_util_pct=sm))
        return readings

    def _check(self, gpu: int) -> None:
        if not 0 <= gpu < self.count:
            raise GpuLost(gpu, "no such simulated GPU")

    def reopen(self, gpu: int) -> DeviceInfo:
        self._check(gpu)
        return self._info(gpu)

    def close(self) -> None:
        pass
