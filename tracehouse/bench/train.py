"""`tracehouse bench train`: what the training API costs the training loop.

Per call of `step(i)`, `with phase(name):` and `scalar(name, value)`, the wall time on the
caller's thread (tracehouse's worker thread runs meanwhile, as in training, and takes the GIL
when it does), with a `tracehouse serve` of its own (a process, on a temporary store) up, and
with the server away (a closed port: every batch goes to the spool on disk). Baselines, timed
the same way in the same process: a call of an empty Python function and a list append. Also
what listening for captures on demand adds to each `step()` (its test for an order, against an
empty loop), the CPU time of all of the process's threads per record, and a check that every
step recorded with the server up was stored.
"""

from __future__ import annotations

import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import training
from tracehouse.bench.common import _stamp, serving
from tracehouse.channel import ClientSecurity

GOAL_STEP_NS = 5_000


def _per_call(loop: Callable[[int], None], calls: int, rounds: int, settle: Callable[[], None] = lambda: None) -> float:
    """Median ns per call of `loop(calls)` over `rounds` rounds; `settle()` runs between
    rounds, untimed."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        loop(calls)
        times.append((time.perf_counter_ns() - started) / calls)
        settle()
    return round(statistics.median(times), 1)


def _baselines(calls: int, rounds: int) -> dict[str, float]:
    def nothing(i: int) -> None:
        pass

    def calls_nothing(n: int) -> None:
        for i in range(n):
            nothing(i)

    def appends(n: int) -> None:
        kept: list[int] = []
        for i in range(n):
            kept.append(i)

    return {
        "empty_function_ns": _per_call(calls_nothing, calls, rounds),
        "list_append_ns": _per_call(appends, calls, rounds),
    }


def _measure(run: training.Run, calls: int, rounds: int) -> dict[str, Any]:
    step, phase, scalar = training.step, training.phase, training.scalar

    def steps(n: int) -> None:
        for i in range(n):
            step(i)

    def phases(n: int) -> None:
        for _ in range(n):
            with phase("forward"):
                pass

    def scalars(n: int) -> None:
        for i in range(n):
            scalar("loss", 1.0 / (i + 1))

    def loops(n: int) -> None:
        for _ in range(n):
            pass

    def listens(n: int) -> None:  # what step() does for captures on demand when none is asked
        for _ in range(n):
            capture = run._capture
            if capture is not None:
                pass

    def settle() -> None:  # the worker catches up between rounds: a round never fills the buffer
        while run._buffer:
            time.sleep(0.01)

    result: dict[str, Any] = {
        "capture_listening_ns": round(_per_call(listens, calls, rounds) - _per_call(loops, calls, rounds), 1)
    }
    cpu_started = time.process_time()
    for name, loop in (("step_ns", steps), ("phase_ns", phases), ("scalar_ns", scalars)):
        result[name] = _per_call(loop, calls, rounds, settle)
    report = run.end()
    records = sum(report[k] for k in ("steps", "phases", "scalars"))
    result["cpu_us_per_record_all_threads"] = round((time.process_time() - cpu_started) * 1e6 / records, 2)
    result["report"] = report
    return result


def _closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def bench_train(calls: int, rounds: int) -> dict[str, Any]:
    from query.client import Client

    if calls > training.BUFFER_RECORDS:
        raise ValueError(f"--calls {calls}: a round must fit the buffer ({training.BUFFER_RECORDS} records)")
    plain = ClientSecurity()
    baselines = _baselines(calls, rounds)
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        with serving(folder) as (address, _):
            up = _measure(training.run("bench-train", server=address, security=plain, spool=Path(folder) / "up",
                                       nvtx=False), calls, rounds)  # fmt: skip
            with Client(address) as client:
                stored = int(client.sql(f"SELECT count() AS n FROM events WHERE run_id = '{up['report']['run_id']}' "
                                        "AND kind = 'step'")["n"][0])  # fmt: skip
        down = _measure(training.run("bench-train-offline", server=_closed_port(), security=plain,
                                     spool=Path(folder) / "down", nvtx=False), calls, rounds)  # fmt: skip
    worst_step = max(up["step_ns"], down["step_ns"])
    return {
        **_stamp("train", "grpcio"),
        "calls_per_round": calls,
        "rounds": rounds,
        "baseline": baselines,
        "server_up": {**{k: v for k, v in up.items() if k != "report"}, "stored_steps": stored,
                      "recorded_steps": up["report"]["steps"], "dropped_records": up["report"]["dropped_records"]},
        "server_down": {**{k: v for k, v in down.items() if k != "report"},
                        "spooled_batches": down["report"]["spooled_batches"],
                        "dropped_records": down["report"]["dropped_records"]},
        "goal": {"step_ns": GOAL_STEP_NS, "met": worst_step < GOAL_STEP_NS},
    }  # fmt: skip
