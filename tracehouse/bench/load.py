"""`tracehouse bench load`: a fleet against one `tracehouse serve`: the rate the server accepts against
the rate the fleet offers, what each value costs the server, and whether every value was stored once.
`--agents`: that many real agents in this process; `--writers`: that many agents' batches, encoded once
and replayed over many channels (tracehouse/bench/payloads.py, fleet.py), at the scale of a fleet; with
`--readers`, the writers twice on two copies of one filled store: alone, then beside heavy readers."""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from agent.runs.children import stop_process
from ingest.admission import DEFAULT_TARGET_MS
from ingest.commitpolicy import DEFAULT_MAX_ROWS
from tracehouse.bench.common import _listening, _stamp, serving, start_serve
from tracehouse.bench.fleet import replay
from tracehouse.bench.fleetreport import Server, fleet_report, read_store
from tracehouse.bench.payloads import MS, FleetBatches
from tracehouse.bench.query import _synthetic_run

READ_RUN = "bench-run"  # the run tracehouse/bench/query.py fills the store with
READ_BUCKETS = READ_PAGE = 100_000  # what each heavy reader asks for: the most the Query service answers
READERS_WARM_S = 2.0  # the readers run this long before the writers start

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _thread_cpu(pid: int) -> collections.Counter[str]:
    """CPU time so far (clock ticks) of each live thread of `pid`, summed by what it does, told by the name it has
    now: Python's threads keep the process's name; gRPC's, the engine's merges and its other threads
    (inserts, queries, schedulers) have their own. Empty once the process is gone."""
    by_kind: collections.Counter[str] = collections.Counter()
    try:
        python = Path(f"/proc/{pid}/comm").read_text().strip()
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return by_kind
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        kind = {python: "python", "event_engine": "grpc"}.get(name) or (
            "engine_merges" if name.startswith("MergeMutate") else "engine_other"
        )
        by_kind[kind] += int(fields[11]) + int(fields[12])  # utime, stime
    return by_kind


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


def bench_fleet(
    writers: int,
    gpus: int = 8,
    interval: float = 2.0,
    seconds: float = 60.0,
    *,
    channels: int = 32,
    max_pending_bytes: int = 256 << 20,
    ack_target_ms: int = DEFAULT_TARGET_MS,
    ack_within_ms: int | None = None,
    commit_rows: int = DEFAULT_MAX_ROWS,
    kill_at: float | None = None,
    restart_after: float = 5.0,
    baseline_seconds: float = 5.0,
    readers: int = 0,
    read_events: int = 8_000_000,
) -> dict[str, Any]:
    """`writers` agents' batches (`gpus` GPUs at 10 Hz, one batch every `interval` s each) for `seconds`
    against `tracehouse serve` on a temporary embedded store, killed (-9) at `kill_at` and started again
    `restart_after` s later when asked. The baseline: the same generator for `baseline_seconds`, each writer
    sending as fast as it is answered, against a server that drops every write: the most it can offer.
    Then the store, opened in this process, tells what it holds of each batch and how many inserts made it.
    With `readers`: the store first holds a traced run of about `read_events` events, and the writers run twice,
    each time against a serve on a copy of it: alone, then beside `readers` heavy readers of that run."""

    if kill_at is not None and not 0 <= kill_at < seconds:
        raise ValueError(f"--kill-at: {kill_at} s is not within the run's {seconds} s")
    batches = FleetBatches(writers, gpus, round(interval * 1000))
    ceiling = _generator_ceiling(batches, channels, baseline_seconds)
    options = {"--max-pending-bytes": max_pending_bytes, "--ack-target-ms": ack_target_ms,
               "--commit-rows": commit_rows}  # fmt: skip
    if ack_within_ms is not None:
        options["--ack-within-ms"] = ack_within_ms
    serve_options = tuple(text for pair in options.items() for text in map(str, pair))
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        events = _filled(folder, read_events) if readers else 0
        figures = _measured(batches, folder, "alone", serve_options, seconds, channels, kill_at, restart_after)
        if readers:
            beside = _measured(
                batches, folder, "read", serve_options, seconds, channels, kill_at, restart_after, readers
            )
    # how many times the offered rate this generator reaches alone: well above 1, it is not what limits
    ceiling["headroom"] = round(ceiling["values_per_s"] / figures["offered_values_per_s"], 1)
    if readers:
        figures = _beside_readers(figures, beside, readers, events)
    return {
        **_stamp("load", "chdb", "grpcio"),
        "writers": writers,
        "gpus_per_writer": gpus,
        "interval_s": batches.interval_ns / 1e9,
        "seconds": seconds,
        "channels": channels,
        "ack_target_ms": ack_target_ms,
        "ack_within_ms": ack_within_ms,
        "commit_rows": commit_rows,
        "values_per_batch": batches.templates[0].rows,
        "bytes_per_batch": len(batches.templates[0].payload),
        "kill_at_s": kill_at,
        "baseline": ceiling,
        **figures,
    }


def _measured(
    batches: FleetBatches, folder: str, name: str, options: Sequence[str], seconds: float, channels: int,
    kill_at: float | None, restart_after: float, readers: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """The writers' figures against a serve on its own copy of the store in `folder` (none there: a new
    one), with `readers` heavy readers asking meanwhile (their tally under "readers")."""
    here = os.path.join(folder, name)
    os.makedirs(here)
    if os.path.isdir(os.path.join(folder, "store")):
        shutil.copytree(os.path.join(folder, "store"), os.path.join(here, "store"), symlinks=True)
    serve = _Serve(here, options)
    reading = _HeavyReaders(serve.address, readers, here) if readers else None
    try:
        cpu: list[tuple[float, float, collections.Counter[str]]] = []  # serve's, this process's, serve's by thread
        mark = lambda: cpu.append((serve.cpu_seconds(), time.process_time(), serve.thread_cpu()))  # noqa: E731
        hooks = [(0.0, mark), (seconds, mark)]
        if kill_at is not None:
            hooks += [(kill_at, serve.kill), (kill_at + restart_after, serve.restart)]
        base_ns = time.time_ns() // MS * MS
        drain_s = max(30.0, seconds) + (restart_after if kill_at is not None else 0.0)
        run = replay(batches, serve.address, seconds, channels, base_ns, drain_s=drain_s, hooks=hooks)
    finally:
        tally = reading.stop() if reading is not None else None
        serve.stop()
    stored = read_store(here, batches, base_ns)
    (serve_start, generator_start, threads_start), (serve_end, generator_end, threads_end) = cpu
    threads = {kind: (ticks - threads_start[kind]) / _TICKS_PER_S for kind, ticks in threads_end.items()}
    server = Server(serve_end - serve_start, generator_end - generator_start, serve.peak_mb, serve.kills, threads)
    figures = fleet_report(batches, run, seconds, kill_at, server, stored)
    return figures if tally is None else figures | {"readers": tally}


def _filled(folder: str, events: int) -> int:
    """A store in `folder` with one traced run of about `events` events for the readers (the run of
    `bench query`); how many events it holds."""
    from store.store import Store
    from tracehouse.model import DEFAULT_LIMITS, ROLLUP_SECONDS

    with Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS) as store:
        kernels = max(1, events * 10 // 21)  # as many launch calls, and a tenth as many NVTX ranges
        _synthetic_run(store, kernels, kernels // 10, 1000, time.time_ns() - 86_400 * 10**9)
        for table in ("samples", *ROLLUP_SECONDS):  # the writers' alone, as read_store counts them
            store.execute(f"TRUNCATE TABLE {{db}}.{table}")
        return int(store.query("SELECT count() AS n FROM {db}.events").column("n")[0].as_py())


def _beside_readers(alone: dict[str, Any], beside: dict[str, Any], readers: int, events: int) -> dict[str, Any]:
    """The writers' figures alone, with those beside the readers and the ratio of their p99s."""
    without, with_readers = alone["ack_latency_ms"]["p99"], beside["ack_latency_ms"]["p99"]
    ratio = round(with_readers / without, 2) if without and with_readers is not None else None
    compared = {
        "goal": "<= 2",
        "measured": ratio,
        "met": ratio is not None and ratio <= 2 and beside["lost"] == beside["duplicated"] == 0,
    }
    kept = (
        "accepted_values_per_s", "ratio", "ack_latency_ms", "delivery_delay_ms", "server_cpu_seconds",
        "server_cpu_us_per_value", "server_cpu_us_per_value_by_thread", "server_peak_rss_mb", "lost", "duplicated",
        "resource_exhausted", "unavailable", "deadline_exceeded", "other_errors", "first_other_error", "refused",
    )  # fmt: skip
    goal = {name: judged for name, judged in alone["goal"].items() if name != "met"}
    goal["write_p99_beside_readers"] = compared
    return alone | {
        "readers": {"readers": readers, "events": events, **beside["readers"]},
        "with_readers": {name: beside[name] for name in kept},
        "write_p99_ms": {"without_readers": without, "with_readers": with_readers, "ratio": ratio},
        "goal": goal | {"met": all(judged["met"] for judged in goal.values())},
    }


class _HeavyReaders:
    """`heavy_readers` as a child process (its threads take no turn from the writers' loop), started
    READERS_WARM_S before the writers; `stop()` ends it and returns its tally."""

    def __init__(self, address: str, readers: int, folder: str) -> None:
        import subprocess
        import sys

        from agent.runs.children import with_parent
        from tracehouse.bench.common import _child_environment

        code = f"from tracehouse.bench.load import heavy_readers; heavy_readers({address!r}, {readers})"
        self.process = subprocess.Popen(
            with_parent([sys.executable, "-c", code]), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=_child_environment(folder), text=True,
        )  # fmt: skip
        time.sleep(READERS_WARM_S)

    def stop(self) -> dict[str, Any]:
        out, _ = self.process.communicate("stop\n", timeout=300)
        if self.process.returncode != 0:
            raise RuntimeError(f"the heavy readers failed (exit {self.process.returncode})")
        tally: dict[str, Any] = json.loads(out)
        return tally


def heavy_readers(address: str, readers: int) -> None:
    """`readers` threads, each asking `address` again and again for the bench's run (even ones its lanes in
    READ_BUCKETS buckets, odd ones a page of READ_PAGE events; a refusal for want of a place is followed by
    the pause it asks for), until a line arrives on stdin; then their tally, as JSON on stdout."""
    import grpc

    from tracehouse.pushback import PUSHBACK_KEY, TRANSPORT_MAX_BYTES
    from tracehouse.v1 import query_pb2

    window = query_pb2.Window(run_id=READ_RUN)
    asks = (
        ("/tracehouse.v1.Query/Lanes", query_pb2.LanesRequest(window=window, buckets=READ_BUCKETS)),
        ("/tracehouse.v1.Query/Events", query_pb2.EventsRequest(window=window, page_size=READ_PAGE)),
    )
    stop = threading.Event()
    tally: collections.Counter[str] = collections.Counter()
    answered_ms: list[float] = []
    refused_ms: list[float] = []

    def read(i: int) -> None:
        method, ask = asks[i % len(asks)]
        options = [("grpc.max_receive_message_length", TRANSPORT_MAX_BYTES)]
        with grpc.insecure_channel(address, options=options) as channel:
            call = channel.unary_unary(method)  # bytes in, bytes out: nothing decoded here
            payload = ask.SerializeToString()
            while not stop.is_set():
                started = time.monotonic()
                try:
                    call(payload, timeout=300)
                except grpc.RpcError as error:
                    code = error.code()
                    hint = dict(error.trailing_metadata() or ()).get(PUSHBACK_KEY)
                    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and hint is not None:
                        tally["refused_busy"] += 1
                        refused_ms.append(1000 * (time.monotonic() - started))
                        stop.wait(int(hint) / 1000 * (0.5 + np.random.random()))
                    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        tally["refused_too_large"] += 1  # past its time or memory
                    else:
                        tally[f"failed_{code.name.lower()}"] += 1
                    continue
                tally["answered"] += 1
                answered_ms.append(1000 * (time.monotonic() - started))

    threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    for thread in threads:
        thread.start()
    input()
    stop.set()
    for thread in threads:
        thread.join()

    def spread(ms: list[float]) -> dict[str, int | None]:
        return {
            q: round(float(np.percentile(ms, p))) if ms else None for q, p in (("p50", 50), ("p99", 99), ("max", 100))
        }

    asked = f"lanes of {READ_BUCKETS} buckets and pages of {READ_PAGE} events, by turns"
    print(
        json.dumps({"asked": asked, **tally, "answer_ms": spread(answered_ms), "busy_refusal_ms": spread(refused_ms)})
    )


class _Serve:
    """`tracehouse serve` on one address and store, which the bench may kill (-9) and start again."""

    def __init__(self, folder: str, options: Sequence[str]) -> None:
        self.folder, self.options = folder, tuple(options)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.address = f"127.0.0.1:{probe.getsockname()[1]}"
        self.banked_cpu, self.peak_mb, self.kills = 0.0, 0.0, 0
        self.banked_threads: collections.Counter[str] = collections.Counter()
        self.errors: collections.deque[str] = collections.deque(maxlen=20)
        self.process = start_serve(folder, self.address, *self.options)
        _listening(self.process)

    def cpu_seconds(self) -> float:
        import psutil

        try:
            return self.banked_cpu + sum(psutil.Process(self.process.pid).cpu_times()[:2])
        except psutil.Error:
            return self.banked_cpu

    def thread_cpu(self) -> collections.Counter[str]:
        """serve's CPU clock ticks by what its threads do (those of a killed serve included)."""
        return self.banked_threads + _thread_cpu(self.process.pid)

    def _bank(self) -> None:
        self.peak_mb = max(self.peak_mb, _proc_status_mb(self.process.pid, "VmHWM") or 0.0)
        self.banked_threads = self.thread_cpu()
        self.banked_cpu = self.cpu_seconds()

    def kill(self) -> None:
        self._bank()
        self.process.kill()
        self.process.wait()
        self.kills += 1

    def restart(self) -> None:
        """Started from this (the main) thread, which lives as long as serve should (with_parent)."""
        self.process = start_serve(self.folder, self.address, *self.options)
        threading.Thread(target=self.errors.extend, args=(self.process.stderr,), daemon=True).start()

    def stop(self) -> None:
        if self.process.poll() is not None and self.process.returncode != -9:
            raise RuntimeError(f"tracehouse serve ended during the run: {''.join(self.errors).strip()}")
        self._bank()
        stop_process(self.process, 60.0)


def _generator_ceiling(batches: FleetBatches, channels: int, seconds: float) -> dict[str, Any]:
    import subprocess
    import sys

    from agent.runs.children import with_parent

    sink = subprocess.Popen(
        with_parent([sys.executable, "-c", "from tracehouse.bench.fleet import sink; sink()"]),
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        address, started = _listening(sink), time.process_time()
        run = replay(batches, address, seconds, channels, time.time_ns(), paced=False)
        generator_cpu = time.process_time() - started
    finally:
        stop_process(sink, 10.0)
    sent = sum(d.values for d in run.deliveries if d.acked_s is not None)
    return {
        "what": "this generator, each writer sending as fast as it is answered, to a server that drops every write",
        "seconds": seconds,
        "values_per_s": round(sent / run.finished_s),
        "calls_per_s": round(run.tally.calls / run.finished_s),
        "generator_cpu_us_per_value": round(generator_cpu * 1e6 / sent, 2) if sent else None,
    }
