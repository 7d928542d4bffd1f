"""Reads the GPU backend and the host each tick and hands valid readings to the batcher.

A reading that is garbage (NaN, negative, out of range) is dropped and counted. A GPU
that is lost is isolated and re-opened with backoff while the others keep sampling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agent.shipping.batcher import Batcher
from agent.shipping.stats import Stats
from agent.telemetry.gpu import GpuBackend, GpuLost, ProcessReading
from agent.telemetry.host import HostSampler
from tracehouse import metrics as m
from tracehouse.model import NO_GPU

log = logging.getLogger("tracehouse.agent")

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 60.0
# Readings are stamped to the millisecond, as Prometheus and DCGM's exporter stamp them: NVML
# counters change every few ms at best (power) to every second (utilisation), and the ns of a
# read's scheduling jitter would cost about 2 bytes per stored value.
STAMP_NS = 1_000_000
CLOCK_STEP_NS = 1_000_000_000  # a wall clock that goes back further was set, not late


@dataclass
class _Isolated:
    retry_at: float
    delay: float


@dataclass
class Sampler:
    backend: GpuBackend
    batcher: Batcher
    stats: Stats
    host: HostSampler | None = None
    wall_ns: Callable[[], int] = time.time_ns
    monotonic: Callable[[], float] = time.monotonic
    isolated: dict[int, _Isolated] = field(default_factory=dict)
    _processes: dict[tuple[int, int], str] = field(default_factory=dict)
    _garbage_seen: set[tuple[int, str]] = field(default_factory=set)
    _stamped: dict[tuple[int, str], int] = field(default_factory=dict)

    def _stamp(self, gpu: int, tick: str, wall: int | None = None) -> int:
        """The reading's time to the ms, and after the last one of this GPU and tick: ticks
        that run late and catch up within a ms still give each series one value per instant."""
        stamp = (self.wall_ns() if wall is None else wall) // STAMP_NS * STAMP_NS
        last = self._stamped.get((gpu, tick))
        if last is not None and last - CLOCK_STEP_NS < stamp <= last:
            stamp = last + STAMP_NS
        elif last is not None and stamp <= last:
            log.warning("the wall clock went back %.1f s: readings are stamped with it", (last - stamp) / 1e9)
        self._stamped[(gpu, tick)] = stamp
        return stamp

    def active(self) -> list[int]:
        return [gpu for gpu in self.backend.indices() if gpu not in self.isolated]

    def _record(self, ts: int, gpu: int, readings: Mapping[str, float], pid: int = 0) -> None:
        good: dict[str, float] = {}
        for metric, value in readings.items():
            number = float(value)
            if m.valid(metric, number):
                good[metric] = number
                continue
            self.stats.add(invalid=1)
            if (gpu, metric) not in self._garbage_seen:
                self._garbage_seen.add((gpu, metric))
                where = "host" if gpu == NO_GPU else f"GPU {gpu}"
                log.warning("%s: %s read %r, not a valid value: dropped (and counted)", where, metric, value)
        if good:
            self.batcher.add(ts, gpu, good, pid)
            self.stats.add(sampled=len(good))

    def _isolate(self, lost: GpuLost) -> None:
        previous = self.isolated.get(lost.gpu)
        delay = FIRST_RETRY_S if previous is None else min(MAX_RETRY_S, previous.delay * 2)
        if previous is None:
            log.warning("%s: isolating it, the other GPUs keep sampling; retrying in %.0f s", lost, delay)
        self.isolated[lost.gpu] = _Isolated(self.monotonic() + delay, delay)

    def fast_tick(self, missed: int = 0) -> None:
        if missed:
            self.stats.add(missed_ticks=missed)
        for gpu in self.active():
            ts = self._stamp(gpu, "fast")
            try:
                readings = self.backend.read_fast(gpu)
            except GpuLost as lost:
                self._isolate(lost)
                continue
            self._record(ts, gpu, readings)
        if self.batcher.due():
            self.batcher.flush()

    def slow_tick(self, missed: int = 0) -> None:
        self._retry_lost()
        seen: set[tuple[int, int]] = set()
        host_names: dict[int, str] = {}  # processes whose host readings this tick has, once each
        for gpu in self.active():
            try:
                ts = self._stamp(gpu, "slow")
                self._record(ts, gpu, self.backend.read_slow(gpu))
                for process in self.backend.processes(gpu):
                    seen.add((gpu, process.pid))
                    self._process(ts, gpu, process, host_names)
            except GpuLost as lost:
                self._isolate(lost)
        self._processes_gone(seen)
        wall = self.wall_ns()
        readings = {m.AGENT_WALL_MINUS_MONOTONIC: float(wall - int(self.monotonic() * 1e9))}
        ts = self._stamp(NO_GPU, "slow", wall)
        if self.host is not None:
            readings.update(self.host.read())
            self.host.forget({pid for _, pid in seen})
        self._record(ts, NO_GPU, readings)

    def _process(self, ts: int, gpu: int, process: ProcessReading, host_names: dict[int, str]) -> None:
        readings = {
            metric: value
            for metric, value in (
                (m.PROC_GPU_MEM, process.gpu_mem_bytes),
                (m.PROC_SM_UTIL, process.sm_util_pct),
                (m.PROC_MEM_UTIL, process.mem_util_pct),
            )
            if value is not None
        }
        name = process.name
        if self.host is not None:
            if process.pid not in host_names:
                host_names[process.pid], host_readings = self.host.process(process.pid)
                self._record(ts, NO_GPU, host_readings, process.pid)
            name = name or host_names[process.pid]
        self._record(ts, gpu, readings, process.pid)
        if (gpu, process.pid) not in self._processes:
            self._processes[(gpu, process.pid)] = name
            self.batcher.add_event(
                kind="process", start=ts, end=ts, name=name or f"pid {process.pid}", gpu=gpu, pid=process.pid,
                extras={"state": "start"},
            )  # fmt: skip

    def _processes_gone(self, seen: set[tuple[int, int]]) -> None:
        ts = self.wall_ns()
        for key in set(self._processes) - seen:
            gpu, pid = key
            if gpu in self.isolated:
                continue
            name = self._processes.pop(key)
            self.batcher.add_event(
                kind="process", start=ts, end=ts, name=name or f"pid {pid}", gpu=gpu, pid=pid,
                extras={"state": "end"},
            )  # fmt: skip

    def _retry_lost(self) -> None:
        now = self.monotonic()
        for gpu, state in list(self.isolated.items()):
            if now < state.retry_at:
                continue
            try:
                info = self.backend.reopen(gpu)
            except GpuLost as lost:
                self._isolate(lost)
                continue
            del self.isolated[gpu]
            log.warning("GPU %d is back (%s, %s)", gpu, info.uuid, info.pci_bus_id)
            self.batcher.describe_devices([info])
