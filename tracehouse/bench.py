"""`tracehouse bench ...`: each capability against a baseline run in the same process on
the same data, printed as JSON. Ratios hold on noisy machines; absolute times don't."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from ingest.store import Store
from ingest.validate import ValidatedBatch, validate_batch
from tracehouse import config
from tracehouse.batch import BatchBuilder, encode_request
from tracehouse.channel import encoded_write
from tracehouse.children import Stopped, stop_on_signals, stop_process, with_parent
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.serve import create_server
from tracehouse.v1 import batch_pb2, ingest_pb2

GPUS = 8
METRICS = tuple(
    f"gpu.{name}"
    for name in (
        "util", "mem_util", "mem_used", "mem_total", "power", "energy", "temp", "sm_clock",
        "mem_clock", "pcie_tx", "pcie_rx", "throttle", "ecc_sbe", "ecc_dbe", "fan", "perf_state",
    )
)  # fmt: skip
TICK_NS = 100_000_000  # 10 Hz
GOAL_RATIO = 0.8
GOAL_VALUES_PER_S = 2_000_000


def telemetry_batches(run_id: str, rows: int, batch_rows: int, t0: int) -> list[batch_pb2.Batch]:
    """`rows` sample values shaped like the agent's: every metric of every GPU per 10 Hz tick,
    one timestamp per GPU tick, values that change slowly."""
    per_tick = GPUS * len(METRICS)
    ticks_per_batch = max(1, batch_rows // per_tick)
    ticks = max(1, rows // per_tick)
    rng = np.random.default_rng(7)
    batches = []
    for first in range(0, ticks, ticks_per_batch):
        count = min(ticks_per_batch, ticks - first)
        builder = BatchBuilder(f"{run_id}-{first}", run_id=run_id, host="bench-host")
        tick_times = t0 + (first + np.arange(count)) * TICK_NS
        for gpu in range(GPUS):
            jitter = rng.integers(0, 50_000, count)  # the sampler's µs-scale jitter
            for m, metric in enumerate(METRICS):
                values = np.round(50 + 40 * np.sin((first + np.arange(count)) / (20 + m)), 1)
                builder.add_samples(metric, tick_times + jitter, values, gpu=gpu)
        batches.append(builder.build())
    return batches


def _stamp(bench: str, *packages: str) -> dict[str, Any]:
    """What every benchmark's JSON starts with: which one, when, and on what."""
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    return {
        "bench": bench,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine | {package: version(package) for package in packages},
    }


def _timed(function: Callable[[], None]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def _each(concurrency: int, work: Callable[[Any], None], items: Sequence[Any]) -> None:
    if concurrency == 1:
        for item in items:
            work(item)
        return
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in pool.map(work, items):
            pass


def bench_ingest(
    rows: int, batch_rows: int, rounds: int, store_url: str | None, concurrency: int = 2
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        store = Store.open(store_url or f"chdb://{folder}/store", DEFAULT_LIMITS)
        server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
        channel = grpc.insecure_channel(
            f"127.0.0.1:{server.port}", options=[("grpc.max_send_message_length", 256 << 20)]
        )
        write = encoded_write(channel)  # the requests are encoded before the clock starts
        direct = store.location.client()
        try:
            return _run(rows, batch_rows, rounds, concurrency, store, write, direct)
        finally:
            direct.close()
            channel.close()
            server.stop(5)
            store.close()


def _run(
    rows: int,
    batch_rows: int,
    rounds: int,
    concurrency: int,
    store: Store,
    write: Callable[..., ingest_pb2.WriteResponse],
    direct: Any,
) -> dict[str, Any]:
    t0 = 1_790_000_000_000_000_000
    rates: dict[str, list[float]] = {"grpc": [], "direct": [], "encode": []}
    sent = 0
    for round_ in range(rounds):
        span = rows // (GPUS * len(METRICS)) * TICK_NS
        start = t0 + round_ * 2 * span
        started = time.perf_counter()
        encoded = [encode_request(batch) for batch in telemetry_batches(f"grpc-{round_}", rows, batch_rows, start)]
        encode_seconds = time.perf_counter() - started
        tables: list[ValidatedBatch] = [
            validate_batch(b, DEFAULT_LIMITS, 0)
            for b in telemetry_batches(f"direct-{round_}", rows, batch_rows, start + span)
        ]
        values = sum(t.rows()["samples"] for t in tables)
        rates["encode"].append(values / encode_seconds)

        def send(request: bytes) -> None:
            write(request, timeout=120)

        def insert(batch: ValidatedBatch) -> None:
            direct.insert_arrow(f"{store.db}.samples", batch.samples)

        # alternate which goes first, so that merges started by one do not tax only the other
        runs: list[tuple[str, Callable[[], None]]] = [
            ("grpc", partial(_each, concurrency, send, encoded)),
            ("direct", partial(_each, concurrency, insert, tables)),
        ]
        for name, work in runs if round_ % 2 == 0 else runs[::-1]:
            rates[name].append(values / _timed(work))
        sent += values
    stored = store.query("SELECT count() AS n FROM {db}.samples WHERE startsWith(run_id, 'grpc-')")
    grpc_rate = statistics.median(rates["grpc"])
    direct_rate = statistics.median(rates["direct"])
    return {
        **_stamp("ingest", "chdb", "grpcio"),
        "rows_per_round": rows,
        "batch_rows": batch_rows,
        "rounds": rounds,
        "concurrency": concurrency,
        "grpc_rows_per_s": round(grpc_rate),
        "direct_rows_per_s": round(direct_rate),
        "ratio": round(grpc_rate / direct_rate, 3),
        "grpc_rows_per_s_rounds": [round(r) for r in rates["grpc"]],
        "direct_rows_per_s_rounds": [round(r) for r in rates["direct"]],
        "client_encode_rows_per_s": round(statistics.median(rates["encode"])),
        "sent_rows": sent,
        "stored_rows": int(stored.column("n")[0].as_py()),
        "goal": {
            "ratio": GOAL_RATIO,
            "values_per_s": GOAL_VALUES_PER_S,
            "met": grpc_rate / direct_rate >= GOAL_RATIO and grpc_rate >= GOAL_VALUES_PER_S,
        },
    }


GOAL_AGENT_SHARE = 0.01


def bench_agent(gpus: int, interval: float, seconds: float) -> dict[str, Any]:
    """The agent as it runs in production (its own process, simulated GPUs, shipping to a
    real server) for `seconds`; its CPU share of one core, against a baseline measured in
    this process on the same backend: only reading the simulated GPUs, tick for tick."""
    import subprocess
    import sys

    from agent.simulated import SimulatedBackend

    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        store = Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS)
        server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
        try:
            finished = subprocess.run(
                with_parent([
                    sys.executable, "-m", "tracehouse.cli", "agent", "--simulate", str(gpus),
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


GOAL_IMPORT_RATIO = 0.5
GOAL_IMPORT_EVENTS_PER_S = 1_000_000


def _scan(path: Path, table_names: list[str]) -> int:
    """The baseline: read every row of the tables with Python's sqlite3, nothing else."""
    rows = 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        for table in table_names:
            cursor = connection.execute(f"SELECT * FROM {table}")
            while chunk := cursor.fetchmany(65_536):
                rows += len(chunk)
    return rows


def bench_import(events: int, path: Path | None) -> dict[str, Any]:
    """`tracehouse import` of a synthetic export of `events` events into a `tracehouse serve`,
    each its own process as in production, against a plain sqlite3 scan of the same tables
    in this process. The importer's peak memory comes from the kernel's accounting of it."""
    from agent.nsys import Export
    from agent.nsys_synthetic import Spec, write_export

    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        if path is None:
            path = Path(folder) / "synthetic.sqlite"
            per_step = 51  # events of one step of the synthetic workload with 20 kernels
            write_export(path, Spec(steps=max(1, events // per_step), kernels_per_step=20, gpu_metrics=False))
        file_bytes = path.stat().st_size
        with Export(path) as export:
            source_tables = [s.table for s in export.sources()]
        started = time.perf_counter()
        scanned = _scan(path, source_tables)
        scan_seconds = time.perf_counter() - started
        result, stored, peak_rss = _import_in_processes(path, folder)
    import_seconds = result["seconds"]
    imported = sum(result["events"].values())
    scan_rate = scanned / scan_seconds
    import_rate = imported / import_seconds
    return {
        **_stamp("import"),
        "file_bytes": file_bytes,
        "events": imported,
        "stored_events": stored,
        "import_seconds": round(import_seconds, 2),
        "import_events_per_s": round(import_rate),
        "sqlite3_scan_rows": scanned,
        "sqlite3_scan_rows_per_s": round(scan_rate),
        "ratio": round(import_rate / scan_rate, 3),
        "importer_peak_rss_mb": round(max(peak_rss) / 2**20, 1),
        "goal": {
            "ratio": GOAL_IMPORT_RATIO,
            "events_per_s": GOAL_IMPORT_EVENTS_PER_S,
            "met": import_rate / scan_rate >= GOAL_IMPORT_RATIO and import_rate >= GOAL_IMPORT_EVENTS_PER_S,
        },
    }


def _import_in_processes(path: Path, folder: str) -> tuple[dict[str, Any], int, list[int]]:
    """`tracehouse import` of `path` into a `tracehouse serve` on a store in `folder`, each its own
    process: the importer's JSON line, the events stored, and the importer's sampled memory."""
    import subprocess
    import sys

    with serving(folder) as (address, _):
        importer = subprocess.Popen(
            with_parent([sys.executable, "-m", "tracehouse.cli", "import", "--server", address, str(path)]),
            env=_child_environment(folder), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert importer.stdout is not None
        peak_rss = _watch_rss(importer.pid)
        output = importer.stdout.read()
        if importer.wait() != 0:
            raise RuntimeError(f"tracehouse import failed ({importer.returncode})")
        result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
        from query.client import Client

        with Client(address) as client:
            stored = int(client.sql("SELECT count() AS n FROM events WHERE kind NOT IN ('process', 'thread')")["n"][0])
    return result, stored, peak_rss


def bench_import_kineto(events: int, path: Path | None) -> dict[str, Any]:
    """`tracehouse import` of a PyTorch-profiler trace (a synthetic one, gzip, of about `events`
    events, unless given one) into a `tracehouse serve`, each its own process as in production,
    against a plain `json.load` of the same file in this process (Python's C decoder, gzip
    included; it holds the whole trace in memory, as the importer does not)."""
    import gzip

    from agent.kineto_synthetic import KinetoSpec, events_per_step, write_trace
    from agent.tracefile import GZIP_MAGIC

    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        if path is None:
            path = Path(folder) / "synthetic.pt.trace.json.gz"
            write_trace(path, KinetoSpec(steps=max(1, events // events_per_step(KinetoSpec()))))
        file_bytes = path.stat().st_size
        with path.open("rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC
        started = time.perf_counter()
        with gzip.open(path, "rt", encoding="utf-8") if gzipped else path.open(encoding="utf-8") as text:
            trace = json.load(text)
        in_file = len(trace["traceEvents"] if isinstance(trace, dict) else trace)
        load_seconds = time.perf_counter() - started
        del trace
        result, stored, peak_rss = _import_in_processes(path, folder)
    imported = sum(result["events"].values())
    import_rate = in_file / result["seconds"]
    load_rate = in_file / load_seconds
    return {
        **_stamp("import-kineto", "ijson"),
        "file_bytes": file_bytes,
        "json_load_events": in_file,
        "events": imported,
        "skipped": result["skipped"],
        "stored_events": stored,
        "import_seconds": round(result["seconds"], 2),
        "import_events_per_s": round(import_rate),
        "json_load_seconds": round(load_seconds, 2),
        "json_load_events_per_s": round(load_rate),
        "ratio": round(import_rate / load_rate, 3),
        "importer_peak_rss_mb": round(max(peak_rss) / 2**20, 1),
    }


def _watch_rss(pid: int) -> list[int]:
    """Resident memory of a process, sampled every 20 ms until it ends (the kernel's own peak
    counter is no use here: a child inherits it from the parent it was forked from)."""
    import psutil

    seen = [0]

    def sample() -> None:
        try:
            process = psutil.Process(pid)
            while process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                seen.append(process.memory_info().rss)
                time.sleep(0.02)
        except psutil.Error:
            pass

    threading.Thread(target=sample, daemon=True).start()
    return seen


def _child_environment(folder: str) -> dict[str, str]:
    """This environment for a child process of a benchmark, less the user's tracehouse settings
    (store, password, server, credentials), with its home in the benchmark's `folder`."""
    mine = {name: value for name, value in os.environ.items() if not name.startswith("TRACEHOUSE_")}
    return mine | {config.ENV_HOME: folder, "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def serving(folder: str, *options: str) -> Iterator[tuple[str, Any]]:
    """`tracehouse serve` as a child process on an embedded store in `folder`: its address and process."""
    import subprocess
    import sys

    server = subprocess.Popen(
        with_parent([sys.executable, "-m", "tracehouse.cli", "serve", "--listen", "127.0.0.1:0",
                     "--store", f"chdb://{folder}/store", *options]),
        env=_child_environment(folder), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield _listening(server), server
    finally:
        stop_process(server, 60.0)


def _listening(server: Any) -> str:
    import re

    for line in server.stderr:
        found = re.search(r"listening on ([\d.]+:\d+)", line)
        if found:
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            return found.group(1)
    raise RuntimeError("tracehouse serve did not start")


GOAL_QUERY_SECONDS = 2.0
# the questions the goal is about; the baseline and the timeline's lanes are measured beside them
GOAL_QUESTIONS = ("series_2000_points", "events_1s_window", "gpu_time", "nvtx_gpu", "phases")
QUERY_GPUS = 8
KERNELS_PER_STEP = 40  # per GPU
STEP_NS = 1_000_000_000
SAMPLE_NS = 10_000_000  # 100 Hz
QUERY_METRICS = ("gpu.util_pct", "gpu.mem_used_bytes", "gpu.power_w", "gpu.temp_c")


def _synthetic_run(store: Store, kernels: int, ranges: int, samples: int, t0: int) -> int:
    """Fill the store, inside ClickHouse, with one training run on 8 GPUs: 8 processes, one
    per GPU, each stepping once a second (NVTX step > forward, backward, optimizer), 40
    kernels per step launched by cudaLaunchKernel, and 4 NVML series per GPU at 100 Hz.
    Returns the run's span in ns."""
    steps = max(1, ranges // (4 * QUERY_GPUS))
    span = steps * STEP_NS
    ts = "fromUnixTimestamp64Nano"
    launch = (
        f"{t0} + intDiv(intDiv(number, {QUERY_GPUS}), {KERNELS_PER_STEP}) * {STEP_NS} + 1000000"
        f" + (intDiv(number, {QUERY_GPUS}) % {KERNELS_PER_STEP}) * 20000000 + cityHash64(number) % 1000000"
    )
    common = "'bench-run' AS run_id, 'bench-host' AS host"
    thread = f"number % {QUERY_GPUS} + 1"
    store.execute(f"""
INSERT INTO {{db}}.events (run_id, host, kind, start, end, gpu, stream, pid, tid, name, correlation_id, bytes, depth,
                           extras, id, launch_start)
SELECT {common}, 'kernel', {ts}(s, 'UTC'), {ts}(s + 5000000 + cityHash64(number, 1) % 5000000, 'UTC'),
       number % {QUERY_GPUS}, 7, {thread}, {thread},
       concat('kernel_', toString(intDiv(number, {QUERY_GPUS}) % 20)), number, 0, 0, map(), number,
       {ts}(l, 'UTC')
FROM (SELECT number, {launch} AS l, l + 10000 AS s FROM numbers({kernels}))""")
    store.execute(f"""
INSERT INTO {{db}}.events (run_id, host, kind, start, end, gpu, stream, pid, tid, name, correlation_id, bytes, depth,
                           extras, id, launch_start)
SELECT {common}, 'cuda_api', {ts}(l, 'UTC'), {ts}(l + 5000, 'UTC'), -1, -1, {thread}, {thread}, 'cudaLaunchKernel',
       number, 0, 0, map(), {kernels} + number, NULL
FROM (SELECT number, {launch} AS l FROM numbers({kernels}))""")
    store.execute(f"""
INSERT INTO {{db}}.events (run_id, host, kind, start, end, gpu, stream, pid, tid, name, correlation_id, bytes, depth,
                           extras, id, launch_start)
SELECT {common}, 'nvtx', {ts}(s, 'UTC'), {ts}(e, 'UTC'), -1, -1, p, p, part, 0, 0, part != 'step',
       map('style', 'PushPop'), {2 * kernels} + number, NULL
FROM (SELECT number, intDiv(number, 4) % {QUERY_GPUS} + 1 AS p,
             ['step', 'forward', 'backward', 'optimizer'][number % 4 + 1] AS part,
             {t0} + intDiv(number, {4 * QUERY_GPUS}) * {STEP_NS} AS step_start,
             step_start + [0, 1000000, 400000000, 800000000][number % 4 + 1] AS s,
             step_start + [900000000, 400000000, 800000000, 900000000][number % 4 + 1] AS e
      FROM numbers({steps * 4 * QUERY_GPUS}))""")
    per_series = max(1, samples // (QUERY_GPUS * len(QUERY_METRICS)))
    metrics = "[" + ", ".join(f"'{m}'" for m in QUERY_METRICS) + "]"
    store.execute(f"""
INSERT INTO {{db}}.samples (run_id, host, gpu, pid, metric, ts, value)
SELECT 'bench-agent', 'bench-host', gpu, 0, metric, {ts}(t, 'UTC'), value
FROM (SELECT number % {QUERY_GPUS} AS gpu,
             {metrics}[intDiv(number, {QUERY_GPUS}) % {len(QUERY_METRICS)} + 1] AS metric,
             {t0} + intDiv(number, {QUERY_GPUS * len(QUERY_METRICS)}) * {span // per_series} AS t,
             (cityHash64(number) % 1000) / 10 AS value
      FROM numbers({per_series * QUERY_GPUS * len(QUERY_METRICS)}))""")
    store.execute(f"""
INSERT INTO {{db}}.runs (run_id, name, host, source, start, end, relative_time, tags, attrs, importing, updated)
VALUES ('bench-run', 'bench', 'bench-host', 'nsys', {ts}({t0}, 'UTC'), {ts}({t0 + span}, 'UTC'), false, map(), map(),
        false, now64(9))""")
    return span


def bench_query(kernels: int, ranges: int, samples: int) -> dict[str, Any]:
    """Latency of the questions that must be fast, on one synthetic run, through the Query
    service; the baseline is a scan that touches every event once."""
    from query.client import Client

    t0 = 1_790_000_000_000_000_000
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        store = Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS)
        server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
        client = Client(f"127.0.0.1:{server.port}", timeout=600)
        try:
            started = time.perf_counter()
            span = _synthetic_run(store, kernels, ranges, samples, t0)
            store.execute("OPTIMIZE TABLE {db}.events FINAL")
            store.execute("OPTIMIZE TABLE {db}.samples FINAL")
            generated = time.perf_counter() - started
            counts = store.query(
                "SELECT (SELECT count() FROM {db}.events WHERE kind = 'kernel') AS kernels, "
                "(SELECT count() FROM {db}.events WHERE kind = 'cuda_api') AS api, "
                "(SELECT count() FROM {db}.events WHERE kind = 'nvtx') AS ranges, "
                "(SELECT count() FROM {db}.samples) AS samples"
            ).to_pylist()[0]
            middle = t0 + span // 2
            questions: dict[str, Callable[[], Any]] = {
                "baseline_scan_events": lambda: store.query(
                    "SELECT count(), sum(toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)) FROM {db}.events"
                ),
                "series_2000_points": lambda: client.series("gpu.util_pct", max_points=2000, run="bench-run"),
                "events_1s_window": lambda: client.events(start=middle, end=middle + STEP_NS, run="bench-run"),
                "lanes_1500_buckets": lambda: client.lanes(buckets=1500, run="bench-run"),
                "gpu_time": lambda: client.gpu_time(run="bench-run"),
                "nvtx_gpu": lambda: client.nvtx_gpu(run="bench-run"),
                "phases": lambda: client.phases(run="bench-run"),
            }
            seconds = {}
            for name, ask in questions.items():
                ask()  # the first run warms caches; the second is timed
                seconds[name] = round(_timed(ask), 3)
        finally:
            client.close()
            server.stop(5)
            store.close()
    slowest = max(seconds[question] for question in GOAL_QUESTIONS)
    return {
        **_stamp("query", "chdb"),
        "data": {**counts, "span_s": span / 1e9, "generated_in_s": round(generated, 1)},
        "seconds": seconds,
        "goal": {"seconds": GOAL_QUERY_SECONDS, "questions": GOAL_QUESTIONS, "met": slowest <= GOAL_QUERY_SECONDS},
    }


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
    from agent.shipper import Outcome
    from agent.simulated import SimulatedBackend
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


def main(args: argparse.Namespace) -> int:
    """A benchmark; SIGTERM, SIGINT or SIGHUP stop it, and the processes it started with it."""
    try:
        with stop_on_signals():
            return _main(args)
    except Stopped as stopped:
        print(f"tracehouse: bench stopped by {signal.Signals(stopped.signal).name}", file=sys.stderr)
        return 128 + stopped.signal


def _main(args: argparse.Namespace) -> int:
    if args.what == "ingest":
        result = bench_ingest(args.rows, args.batch_rows, args.rounds, args.store)
        print(json.dumps(result, indent=2))
        return 0 if result["sent_rows"] == result["stored_rows"] else 1
    if args.what == "import":
        if args.kineto:
            result = bench_import_kineto(args.events or 1_000_000, args.file)
        else:
            result = bench_import(args.events or 5_000_000, args.file)
        print(json.dumps(result, indent=2))
        return 0 if result["events"] == result["stored_events"] else 1
    if args.what == "query":
        result = bench_query(args.kernels, args.ranges, args.samples)
        print(json.dumps(result, indent=2))
        return 0
    if args.what == "agent":
        result = bench_agent(args.gpus, args.interval, args.seconds)
        print(json.dumps(result, indent=2))
        return 0 if result["sampled_values"] == result["stored_values"] else 1
    if args.what == "storage":
        from tracehouse.bench_storage import bench_storage

        result = bench_storage(args.gpus, args.minutes, 0.1, args.steps)
        print(json.dumps(result, indent=2))
        return 0 if result["goal"]["met"] else 1
    if args.what == "load":
        result = bench_load(args.agents, args.gpus, args.interval, args.seconds, args.max_pending_bytes)
        print(json.dumps(result, indent=2))
        return 0 if result["goal"]["met"] else 1
    if args.what == "train":
        from tracehouse.bench_train import bench_train

        result = bench_train(args.calls, args.rounds)
        print(json.dumps(result, indent=2))
        up, down = result["server_up"], result["server_down"]
        kept = up["stored_steps"] == up["recorded_steps"] and up["dropped_records"] == down["dropped_records"] == 0
        return 0 if kept else 1
    if args.what == "run":
        from tracehouse.bench_run import bench_run

        result = bench_run(args.reps, args.gpus, args.seconds, args.children)
        print(json.dumps(result, indent=2))
        return 0 if result["process_tree"]["found_all"] else 1
    raise AssertionError(args.what)
