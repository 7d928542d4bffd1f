"""`tracehouse bench query`: latency of the questions that must be fast, through the Query
service on one synthetic run, against a scan of every event."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

from query.analysis import gpu_time, nvtx_gpu_summary, phases
from query.keeper import keep_runs
from query.service import DEFAULT_MIN_GAP_NS
from query.window import Predicates, RunSpan, Window, bounds, event_predicates
from store.store import Store
from store.tables import rollup_select
from tracehouse.bench.common import _stamp, _timed
from tracehouse.cli.serve import create_server
from tracehouse.model import DEFAULT_LIMITS, ROLLUP_SECONDS

GOAL_QUERY_SECONDS = 2.0
# the questions the goal is about; the baseline and the timeline's lanes are measured beside them
GOAL_QUESTIONS = ("series_2000_points", "events_1s_window", "gpu_time", "nvtx_gpu", "phases")
QUERY_GPUS = 8
KERNELS_PER_STEP = 40  # per GPU
STEP_NS = 1_000_000_000
SAMPLE_NS = 10_000_000  # 100 Hz
HOUR_NS = 3600 * 10**9  # gpu-time and phases of an hour inside the run: a window that cuts it
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
    for table, seconds in ROLLUP_SECONDS.items():  # as ingest rolls up what it stores (store/rollup.py)
        store.execute(f"INSERT INTO {{db}}.{table} {rollup_select('{db}.samples', seconds)}")
    store.execute(f"""
INSERT INTO {{db}}.runs (run_id, name, host, source, start, end, relative_time, tags, attrs, importing, updated)
VALUES ('bench-run', 'bench', 'bench-host', 'nsys', {ts}({t0}, 'UTC'), {ts}({t0 + span}, 'UTC'), false, map(), map(),
        false, now64(9))""")
    return span


def _ask(store: Store, t0: int, span: int) -> dict[str, float]:
    """Each question twice through the Query service; the second answer's seconds."""
    from query.client import Client

    server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
    client = Client(f"127.0.0.1:{server.port}", timeout=600)
    middle = t0 + span // 2
    questions: dict[str, Callable[[], Any]] = {
        "baseline_scan_events": lambda: store.query(
            "SELECT count(), sum(toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)) FROM {db}.events"
        ),
        "series_2000_points": lambda: client.series("gpu.util_pct", max_points=2000, run="bench-run"),
        "events_1s_window": lambda: client.events(start=middle, end=middle + STEP_NS, run="bench-run"),
        "lanes_1500_buckets": lambda: client.lanes(buckets=1500, run="bench-run"),
        "gpu_time": lambda: client.gpu_time(run="bench-run"),
        "gpu_time_hour": lambda: client.gpu_time(run="bench-run", start=middle, end=middle + HOUR_NS),
        "nvtx_gpu": lambda: client.nvtx_gpu(run="bench-run"),
        "phases": lambda: client.phases(run="bench-run"),
        "phases_hour": lambda: client.phases(run="bench-run", start=middle, end=middle + HOUR_NS),
    }
    try:
        return _second_answers(questions)
    finally:
        client.close()
        server.stop(5)


def _second_answers(questions: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Each question asked twice: the second answer's seconds (the first warms caches)."""
    seconds = {}
    for name, ask in questions.items():
        ask()
        seconds[name] = round(_timed(ask), 3)
    return seconds


def _made_at_the_question(store: Store, t0: int, span: int) -> dict[str, float]:
    """The baseline of what is kept: the questions that read it, made from the events (as the Query
    service makes them until a run is kept), on the same store."""
    where = Predicates()
    where.add("run_id = {run_id:String}", run_id="bench-run")
    middle = t0 + span // 2
    run = RunSpan("bench-run", "bench-host", t0, t0 + span, relative_time=False)
    hour = Window(from_ns=middle, to_ns=middle + HOUR_NS)
    hour_from, hour_to = bounds(hour, run)
    questions: dict[str, Callable[[], Any]] = {
        "gpu_time": lambda: store.query(*gpu_time(where, t0, t0 + span, DEFAULT_MIN_GAP_NS, 1000)),
        "gpu_time_hour": lambda: store.query(
            *gpu_time(event_predicates(hour, run), hour_from, hour_to, DEFAULT_MIN_GAP_NS, 1000)
        ),
        "nvtx_gpu": lambda: store.query(*nvtx_gpu_summary(where)),
        "phases": lambda: store.query(*phases(where)),
    }
    return _second_answers(questions)


def bench_query(kernels: int, ranges: int, samples: int) -> dict[str, Any]:
    """Latency of the questions that must be fast, on one synthetic run, through the Query
    service; the baseline is a scan that touches every event once. What is kept of the run is kept
    first, as `serve` keeps an imported trace's; the questions that read it are also timed made from
    the events, as before it is kept."""
    t0 = 1_790_000_000_000_000_000
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as folder:
        store = Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS)
        try:
            started = time.perf_counter()
            span = _synthetic_run(store, kernels, ranges, samples, t0)
            store.execute("OPTIMIZE TABLE {db}.events FINAL")
            store.execute("OPTIMIZE TABLE {db}.samples FINAL")
            generated = time.perf_counter() - started
            made_now = _made_at_the_question(store, t0, span)
            started = time.perf_counter()
            if keep_runs(store) != 1:
                raise RuntimeError("the bench's run was not kept: the questions would not read what is kept")
            kept = time.perf_counter() - started
            counts = store.query(
                "SELECT (SELECT count() FROM {db}.events WHERE kind = 'kernel') AS kernels, "
                "(SELECT count() FROM {db}.events WHERE kind = 'cuda_api') AS api, "
                "(SELECT count() FROM {db}.events WHERE kind = 'nvtx') AS ranges, "
                "(SELECT count() FROM {db}.samples) AS samples"
            ).to_pylist()[0]
            seconds = _ask(store, t0, span)
        finally:
            store.close()
    slowest = max(seconds[question] for question in GOAL_QUESTIONS)
    return {
        **_stamp("query", "chdb"),
        "data": {
            **counts,
            "span_s": span / 1e9,
            "generated_in_s": round(generated, 1),
            "kept_in_s": round(kept, 1),
        },
        "seconds": seconds,
        "made_at_the_question_seconds": made_now,
        "goal": {"seconds": GOAL_QUERY_SECONDS, "questions": GOAL_QUESTIONS, "met": slowest <= GOAL_QUERY_SECONDS},
    }
