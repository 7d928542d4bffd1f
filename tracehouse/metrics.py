"""The series the agent records: names (unit in the name) and the values that make sense.

A reading outside its range (NaN, negative, NVML's all-ones "not available") is not a
sample: the sampler drops it and counts it as invalid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    low: float = 0.0
    high: float = math.inf


def _catalogue(*metrics: Metric) -> dict[str, Metric]:
    return {m.name: m for m in metrics}


PCT = 100.0
TERABYTE = 1e15

GPU_UTIL = "gpu.util_pct"
GPU_MEM_UTIL = "gpu.mem_util_pct"
GPU_MEM_USED = "gpu.mem_used_bytes"
GPU_MEM_TOTAL = "gpu.mem_total_bytes"
GPU_POWER = "gpu.power_w"
GPU_ENERGY = "gpu.energy_j"
GPU_TEMP = "gpu.temp_c"
GPU_MEM_TEMP = "gpu.mem_temp_c"
GPU_SM_CLOCK = "gpu.sm_clock_mhz"
GPU_MEM_CLOCK = "gpu.mem_clock_mhz"
GPU_THROTTLE = "gpu.throttle_reasons"
GPU_ECC_SBE = "gpu.ecc_sbe_volatile"
GPU_ECC_DBE = "gpu.ecc_dbe_volatile"
GPU_PCIE_TX = "gpu.pcie_tx_bytes_per_s"
GPU_PCIE_RX = "gpu.pcie_rx_bytes_per_s"
GPU_SM_OCCUPANCY = "gpu.sm_occupancy_pct"
GPU_TENSOR_ACTIVE = "gpu.tensor_active_pct"
GPU_DRAM_BW = "gpu.dram_bw_util_pct"
GPU_SM_ACTIVE = "gpu.sm_active_pct"
PROC_GPU_MEM = "proc.gpu_mem_bytes"
PROC_SM_UTIL = "proc.sm_util_pct"
PROC_MEM_UTIL = "proc.mem_util_pct"
PROC_CPU = "proc.cpu_pct"
PROC_RSS = "proc.rss_bytes"
HOST_CPU = "host.cpu_pct"
HOST_MEM_USED = "host.mem_used_bytes"
HOST_MEM_TOTAL = "host.mem_total_bytes"
HOST_LOAD1 = "host.load1"
AGENT_WALL_MINUS_MONOTONIC = "agent.wall_minus_monotonic_ns"
AGENT_SERVER_OFFSET = "agent.clock_offset_ns"  # the server's wall clock less the host's (agent/shipping/clockoffset.py)
AGENT_SERVER_OFFSET_UNCERTAINTY = "agent.clock_offset_uncertainty_ns"  # the true offset is within ± this
AGENT_MISSED_TICKS = "agent.missed_ticks"

METRICS = _catalogue(
    Metric(GPU_UTIL, high=PCT),
    Metric(GPU_MEM_UTIL, high=PCT),
    Metric(GPU_MEM_USED, high=TERABYTE),
    Metric(GPU_MEM_TOTAL, high=TERABYTE),
    Metric(GPU_POWER, high=10_000.0),
    Metric(GPU_ENERGY, high=1e15),
    Metric(GPU_TEMP, high=200.0),
    Metric(GPU_MEM_TEMP, high=200.0),
    Metric(GPU_SM_CLOCK, high=10_000.0),
    Metric(GPU_MEM_CLOCK, high=100_000.0),
    Metric(GPU_THROTTLE, high=float(2**63)),
    Metric(GPU_ECC_SBE, high=float(2**63)),
    Metric(GPU_ECC_DBE, high=float(2**63)),
    Metric(GPU_PCIE_TX, high=1e12),
    Metric(GPU_PCIE_RX, high=1e12),
    Metric(GPU_SM_OCCUPANCY, high=PCT),
    Metric(GPU_TENSOR_ACTIVE, high=PCT),
    Metric(GPU_DRAM_BW, high=PCT),
    Metric(GPU_SM_ACTIVE, high=PCT),
    Metric(PROC_GPU_MEM, high=TERABYTE),
    Metric(PROC_SM_UTIL, high=PCT),
    Metric(PROC_MEM_UTIL, high=PCT),
    Metric(PROC_CPU, high=100_000.0),  # percent of one core, summed over threads
    Metric(PROC_RSS, high=1e16),
    Metric(HOST_CPU, high=PCT),
    Metric(HOST_MEM_USED, high=1e16),
    Metric(HOST_MEM_TOTAL, high=1e16),
    Metric(HOST_LOAD1, high=1e6),
    Metric(AGENT_WALL_MINUS_MONOTONIC, low=-math.inf),
    Metric(AGENT_SERVER_OFFSET, low=-math.inf),
    Metric(AGENT_SERVER_OFFSET_UNCERTAINTY),
    Metric(AGENT_MISSED_TICKS, high=1e12),
)


def valid(metric: str, value: float) -> bool:
    """Finite and within the metric's range; unknown metrics only need to be finite."""
    if not math.isfinite(value):
        return False
    known = METRICS.get(metric)
    return known is None or known.low <= value <= known.high
