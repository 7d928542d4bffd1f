"""`tracehouse bench load`: a fleet of simulated agents against one `tracehouse serve`: the rate
the server accepts against the rate the agents offer, and whether every value was stored."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tracehouse.bench.common import _stamp, serving


def _proc_status_mb(pid: int, field: str) -> float | None:
    """A memory figure of a live process from the kernel (VmHWM: its peak resident size)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def bench_load(agents: int, gpus: int, interval: float, seconds: float, max_pending_bytes: int) -> dict[str, Any]:
    """`agents` simulated agents of `gpus` GPUs each, sampling every `interval` s for `seconds`
    in this process (each with its own host name, spool and connection), against one
    `tracehouse serve` process on a temporary embedded store. The baseline is the rate the
    agents offer, measured in the same window as the rate the server accepts. Then the agents
    stop, shipping what they hold, and the store is counted through the Query service."""

    from agent.daemon import Agent, AgentConfig
    from agent.shipping.shipper import Outcome
    from agent.telemetry.simulated import SimulatedBackend
    from query.client import Client

    drain_timeout = max(60.0, 4 * seconds)  # for the backlog of a server that fell behind
    with (
        tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder,
        serving(folder, "--max-pending-bytes", str(max_pending_bytes)) as (address, server),
    ):
        fleet = [
            Agent(
                AgentConfig(
                    server=address, spool=Path(folder) / "spool" / f"{i:03d}", interval=interval,
                    run_name="load", host=f"load-{i:03d}", host_metrics=False, shutdown_timeout=drain_timeout,
                ),
                SimulatedBackend(gpus),
            )
            for i in range(agents)
        ]  # fmt: skip
        calls: list[list[tuple[float, Outcome]]] = [[] for _ in fleet]  # one list per shipper thread
        for agent, mine in zip(fleet, calls, strict=True):
            agent.shipper.on_write = lambda took, outcome, mine=mine: mine.append((took, outcome))
        for agent in fleet:
            agent.start()
        started, (sampled_before, stored_before) = time.monotonic(), _sums(fleet)
        time.sleep(seconds)
        window, (sampled_after, stored_after) = time.monotonic() - started, _sums(fleet)
        with ThreadPoolExecutor(len(fleet)) as pool:
            reports = list(pool.map(lambda agent: agent.stop(), fleet))
        drain_seconds = time.monotonic() - started - window
        with Client(address, timeout=120) as client:
            stored = int(client.sql("SELECT count() AS n FROM samples")["n"][0])
        peak_mb, end_mb = _proc_status_mb(server.pid, "VmHWM"), _proc_status_mb(server.pid, "VmRSS")
        import psutil

        server_cpu = sum(psutil.Process(server.pid).cpu_times()[:2])
    sampled = sum(int(r["sampled"]) for r in reports)
    every = [call for mine in calls for call in mine]
    took = np.array([t for t, outcome in every if outcome is Outcome.STORED]) * 1000
    offered = (sampled_after - sampled_before) / window
    accepted = (stored_after - stored_before) / window
    lost = max(0, sampled - stored)
    return {
        **_stamp("load", "chdb", "grpcio"),
        "agents": agents,
        "gpus_per_agent": gpus,
        "interval_s": interval,
        "seconds": round(window, 2),
        "max_pending_bytes": max_pending_bytes,
        "sampled_values": sampled,
        "stored_values": stored,
        "lost": lost,
        "stored_twice": max(0, stored - sampled),
        "dropped": sum(int(r["dropped"]) for r in reports),
        "left_in_spool": sum(int(r["spooled"]) for r in reports),
        "missed_ticks": sum(int(r["missed_ticks"]) for r in reports),
        "offered_values_per_s": round(offered),
        "accepted_values_per_s": round(accepted),
        "ratio": round(accepted / offered, 3) if offered else None,
        "write_calls": len(every),
        "write_latency_ms": {
            "p50": round(float(np.percentile(took, 50)), 1) if len(took) else None,
            "p99": round(float(np.percentile(took, 99)), 1) if len(took) else None,
            "max": round(float(took.max()), 1) if len(took) else None,
        },
        "resource_exhausted": sum(1 for _, outcome in every if outcome is Outcome.BUSY),
        "server_away": sum(1 for _, outcome in every if outcome is Outcome.RETRY),
        "spooled_batches": sum(agent.shipper.spooled_batches for agent in fleet),
        "drain_seconds": round(drain_seconds, 2),
        "server_peak_rss_mb": peak_mb,
        "server_rss_end_mb": end_mb,
        "server_cpu_seconds": round(server_cpu, 1),
        "goal": {"lost": 0, "met": stored == sampled},
    }


def _sums(fleet: Sequence[Any]) -> tuple[int, int]:
    """Values the agents have sampled so far, and values the server has acknowledged."""
    counts = [agent.stats.snapshot() for agent in fleet]
    return sum(c["sampled"] for c in counts), sum(c["stored"] for c in counts)
