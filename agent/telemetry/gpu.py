"""What the sampler needs from a GPU backend. Backends: `agent.telemetry.nvml` (real), `agent.telemetry.simulated`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tracehouse.batch import BatchBuilder


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    uuid: str
    pci_bus_id: str
    name: str
    memory_total: int = 0
    sm_count: int = 0
    driver: str = ""
    attrs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessReading:
    """One process using one GPU; readings a GPU cannot give are None."""

    pid: int
    name: str
    gpu_mem_bytes: float | None = None
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None


def describe_device(builder: BatchBuilder, host: str, run_id: str, device: DeviceInfo) -> None:
    """Add a device description to a batch: the inventory goes to `devices`."""
    builder.add_device(
        host,
        device.index,
        uuid=device.uuid,
        name=device.name,
        memory_total=device.memory_total,
        sm_count=device.sm_count,
        driver=device.driver,
        pci_bus_id=device.pci_bus_id,
        run_id=run_id,
        attrs=dict(device.attrs),
    )


class BackendUnavailable(Exception):
    """The backend cannot start (no driver, no library); the message says what to do."""


class GpuLost(Exception):
    """One GPU stopped answering (fell off the bus, needs a reset); the others are fine."""

    def __init__(self, gpu: int, reason: str) -> None:
        super().__init__(f"GPU {gpu} lost: {reason}")
        self.gpu = gpu
        self.reason = reason


class GpuBackend(Protocol):
    name: str

    def indices(self) -> list[int]:
        """Every GPU index, including GPUs that could not be opened (they are retried)."""
        ...

    def devices(self) -> list[DeviceInfo]:
        """Every GPU, identified by UUID and PCI bus id."""
        ...

    def read_fast(self, gpu: int) -> dict[str, float]:
        """Readings cheap enough for every tick. Raises GpuLost."""
        ...

    def read_slow(self, gpu: int) -> dict[str, float]:
        """Readings that take long (PCIe throughput) or need a window (GPM). Raises GpuLost."""
        ...

    def processes(self, gpu: int) -> list[ProcessReading]:
        """Processes using the GPU now. Raises GpuLost."""
        ...

    def reopen(self, gpu: int) -> DeviceInfo:
        """Try to get a lost GPU back. Raises GpuLost while it is still gone."""
        ...

    def close(self) -> None: ...
