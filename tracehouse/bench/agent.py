"""`tracehouse bench agent`: the agent's CPU share of one core, against only reading the
simulated GPUs it samples."""

from __future__ import annotations

import json
import tempfile
import time
from typing import Any

from agent.runs.children import with_parent
from store.store import Store
from tracehouse.bench.common import _child_environment, _stamp
from tracehouse.cli.serve import create_server
from tracehouse.model import DEFAULT_LIMITS

GOAL_AGENT_SHARE = 0.01


def bench_agent(gpus: int, interval: float, seconds: float) -> dict[str, Any]:
    """The agent as it runs in production (its own process, simulated GPUs, shipping to a
    real server) for `seconds`; its CPU share of one core, against a baseline measured in
    this process on the same backend: only reading the simulated GPUs, tick for tick."""
    import subprocess
    import sys

    from agent.telemetry.simulated import SimulatedBackend

    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        store = Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS)
        server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
        try:
            finished = subprocess.run(
                with_parent([
                    sys.executable, "-m", "tracehouse.cli.main", "agent", "--simulate", str(gpus),
                    "--interval", str(interval), "--duration", str(seconds),
                    "--server", f"127.0.0.1:{server.port}", "--spool", f"{folder}/spool",
                ]),
                env=_child_environment(folder), capture_output=True, text=True, check=True, timeout=seconds + 120,
            )  # fmt: skip
            report = json.loads(finished.stdout.strip().splitlines()[-1])
            stored = int(store.query("SELECT count() AS n FROM {db}.samples").column("n")[0].as_py())
        finally:
            server.stop(5)
            store.close()
    ticks = int(seconds / interval)
    backend = SimulatedBackend(gpus)
    started = time.process_time()
    for _ in range(ticks):
        for gpu in range(gpus):
            backend.read_fast(gpu)
    baseline_cpu = time.process_time() - started
    share = report["cpu_seconds"] / report["seconds"]
    return {
        **_stamp("agent"),
        "gpus": gpus,
        "interval_s": interval,
        "seconds": report["seconds"],
        "sampled_values": report["sampled"],
        "stored_values": stored,
        "agent_cpu_seconds": report["cpu_seconds"],
        "agent_share_of_one_core": round(share, 5),
        "agent_cpu_us_per_value": round(1e6 * report["cpu_seconds"] / max(1, report["sampled"]), 3),
        "baseline_backend_only_cpu_seconds": round(baseline_cpu, 4),
        "baseline_share_of_one_core": round(baseline_cpu / report["seconds"], 5),
        "ratio_agent_to_baseline": round(report["cpu_seconds"] / max(baseline_cpu, 1e-9), 2),
        "goal": {"share_of_one_core": GOAL_AGENT_SHARE, "met": share <= GOAL_AGENT_SHARE},
    }
