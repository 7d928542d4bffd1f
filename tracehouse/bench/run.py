"""`tracehouse bench run`: what wrapping a command in `tracehouse run` costs it.

- Start and end: the median wall time of `python -c pass` through `tracehouse run` (with no
  telemetry, and with an agent started for it on simulated GPUs) against the same command
  run directly, the baseline, alternated in this process, with a `tracehouse serve` of its own.
- While it runs: the CPU of `tracehouse run --simulate G -- sleep S` (its agent sampling G GPUs
  at 10 Hz, the process tree walked every 0.5 s) against the agent alone
  (`tracehouse agent --simulate G --duration S`), both as processes, start-up included.
- The process tree: a walk of the tree of a command with K children, in µs, and whether
  every child was found; and the number of processes on this host (a walk reads them all
  where Linux does not list children in /proc).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

from agent.runs.proctree import ProcessTree
from tracehouse.bench.common import _child_environment, _stamp, serving


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed_run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of one command."""
    cpu, started = _child_cpu(), time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - started, _child_cpu() - cpu


def _tree_walk(children: int, rounds: int = 50) -> dict[str, Any]:
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(children)]
    try:
        tree = ProcessTree()
        tree.add_root(os.getpid())
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            tree.poll()
            times.append(time.perf_counter() - started)
        found = {p.pid for p in sleepers} <= set(tree.processes)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    return {"children": children, "walk_us_median": round(1e6 * statistics.median(times), 1), "found_all": found}


def bench_run(reps: int, gpus: int, seconds: float, children: int) -> dict[str, Any]:
    plain = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder, serving(folder) as (address, _):
        env = _child_environment(folder)
        run = [sys.executable, "-m", "tracehouse.cli.main", "run", "--server", address]
        walls: dict[str, list[float]] = {"direct": [], "run_no_telemetry": [], "run_with_agent": []}
        for _ in range(reps):
            walls["direct"].append(_timed_run(plain, env)[0])
            walls["run_no_telemetry"].append(_timed_run([*run, "--agent", "none", "--", *plain], env)[0])
            walls["run_with_agent"].append(
                _timed_run([*run, "--agent", "start", "--simulate", str(gpus), "--", *plain], env)[0]
            )
        median = {name: round(statistics.median(times), 3) for name, times in walls.items()}
        sleep = ["sleep", f"{seconds:g}"]
        run_wall, run_cpu = _timed_run([*run, "--agent", "start", "--simulate", str(gpus), "--", *sleep], env)
        agent = [sys.executable, "-m", "tracehouse.cli.main", "agent", "--simulate", str(gpus), "--server", address,
                 "--duration", f"{seconds:g}", "--spool", f"{folder}/agent-spool"]  # fmt: skip
        agent_wall, agent_cpu = _timed_run(agent, env)
    return {
        **_stamp("run", "psutil"),
        "start_and_end_seconds_median": median,
        "added_seconds": {
            "no_telemetry": round(median["run_no_telemetry"] - median["direct"], 3),
            "with_agent": round(median["run_with_agent"] - median["direct"], 3),
        },
        "while_running": {
            "gpus": gpus,
            "seconds": seconds,
            "run_cpu_seconds": round(run_cpu, 3),
            "run_wall_seconds": round(run_wall, 3),
            "run_share_of_one_core": round(run_cpu / run_wall, 4),
            "baseline_agent_cpu_seconds": round(agent_cpu, 3),
            "baseline_agent_wall_seconds": round(agent_wall, 3),
            "baseline_share_of_one_core": round(agent_cpu / agent_wall, 4),
            "ratio_run_to_agent": round(run_cpu / max(agent_cpu, 1e-9), 2),
        },
        "process_tree": {**_tree_walk(children), "host_processes": len(psutil.pids())},
    }
