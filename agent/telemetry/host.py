"""Host metrics beside the GPUs (psutil): CPU, memory, and the CPU of processes using GPUs,
to compare GPU starvation with data loading on the CPU."""

from __future__ import annotations

import os

import psutil

from tracehouse import metrics as m


class HostSampler:
    def __init__(self) -> None:
        psutil.cpu_percent(None)  # the first call only sets the reference point
        self._processes: dict[int, psutil.Process] = {}

    def read(self) -> dict[str, float]:
        memory = psutil.virtual_memory()
        return {
            m.HOST_CPU: psutil.cpu_percent(None),
            m.HOST_MEM_USED: float(memory.total - memory.available),
            m.HOST_MEM_TOTAL: float(memory.total),
            m.HOST_LOAD1: os.getloadavg()[0],
        }

    def process(self, pid: int) -> tuple[str, dict[str, float]]:
        """(name, readings) of one process; empty when it is gone or not ours to see."""
        try:
            process = self._processes.get(pid)
            if process is None:
                process = self._processes[pid] = psutil.Process(pid)
                process.cpu_percent(None)
            with process.oneshot():
                return process.name(), {
                    m.PROC_CPU: process.cpu_percent(None),
                    m.PROC_RSS: float(process.memory_info().rss),
                }
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._processes.pop(pid, None)
            return "", {}

    def forget(self, keep: set[int]) -> None:
        for pid in set(self._processes) - keep:
            del self._processes[pid]
