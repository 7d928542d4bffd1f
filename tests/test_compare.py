"""`query runs --tag` and `query compare` over real gRPC against a real chDB store.

The scene, on host `node1`: the host's agent samples GPU-level series (utilisation, energy,
GPM SM activity on GPU 0 only) on GPUs 0 and 1, and per-process series for every process it
sees. Runs A and B share GPU 0 at the same time (pids 100; 200 and its child 201), a stranger
(pid 300) uses GPU 0 too, and run D is still open on GPU 1 (pid 400). Run E declares nothing and
has no processes. On host `node2`, run C is traced: overlapping kernels and a copy, no
telemetry. Every expected figure is computed here, in plain Python, from the rows written.
Tests of GPU counts, GPU indices and the energy counter write hosts of their own (node3..node7).
"""

from __future__ import annotations

import csv
import io
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest

from query.client import Client, QueryFailed
from tests.helpers import MS, T0, S, request
from tracehouse.batch import BatchBuilder
from tracehouse.cli.main import main
from tracehouse.metrics import GPU_ENERGY, GPU_SM_ACTIVE, GPU_UTIL, PROC_GPU_MEM, PROC_SM_UTIL
from tracehouse.shortnames import short_name
from tracehouse.v1 import ingest_pb2_grpc

HOST = "node1"
TICK = 100 * MS  # GPU-level samples
SLOW = S  # per-process samples
END = T0 + 60 * S  # the agent's last tick is just before


@dataclass
class Rows:
    """What was written: samples as (gpu, pid, metric, ts, value), the runs' spans and events."""

    samples: list[tuple[int, int, str, int, float]] = field(default_factory=list)
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    events: list[tuple[int, int]] = field(default_factory=list)  # process events on node1


@dataclass(frozen=True)
class Run:
    run_id: str
    start: int
    end: int | None
    pids: tuple[int, ...]
    attrs: dict[str, str]
    tags: dict[str, str]


RUNS = (
    Run("A", T0 + 10 * S, T0 + 40 * S, (100,), {"status": "ok", "exit_code": "0"}, {"model": "resnet", "bs": "256"}),
    Run("B", T0 + 20 * S, T0 + 50 * S, (200, 201), {"status": "failed: exit 3", "exit_code": "3", "gpus": "0"},
        {"model": "resnet", "bs": "512", "extra": ""}),
    Run("D", T0 + 45 * S, None, (400,), {}, {"model": "resnet", "bs": "1024"}),
    Run("E", T0 + 5 * S, T0 + 8 * S, (), {"status": "killed: SIGTERM"}, {"model": "bert"}),
)  # fmt: skip
# per-process samples: pid -> (gpu, first, last) seconds after T0
PROCESSES = {100: (0, 10, 39), 200: (0, 20, 49), 201: (0, 30, 44), 300: (0, 0, 59), 400: (1, 46, 59)}
# run C on node2: (kind, gpu, start ms, end ms, name) after T0, in a 100 ms run
LONG_NAME = "void at::native::elementwise_kernel_" + "x" * 80
WORK = (
    ("kernel", 0, 0, 10, "gemm"),
    ("kernel", 0, 5, 20, LONG_NAME),  # overlaps gemm on another stream
    ("memcpy", 0, 30, 35, "[CUDA memcpy HtoD]"),
    ("kernel", 1, 10, 40, "gemm"),
    ("kernel", 1, 90, 110, "softmax"),  # runs past the run's end: busy time is clipped to it
)
C_SPAN = (T0, T0 + 100 * MS)


def _scene(ingest: ingest_pb2_grpc.IngestStub) -> Rows:
    rng = np.random.default_rng(7)
    rows = Rows()
    agent = BatchBuilder("agent-node1", run_id="agent-node1", host=HOST)
    ticks = np.arange(T0, END, TICK)
    for gpu in (0, 1):
        series = {
            GPU_UTIL: rng.uniform(0, 100, ticks.size).round(1),
            GPU_ENERGY: 1e6 * (gpu + 1) + np.cumsum(rng.uniform(20, 40, ticks.size)),  # a counter, in joules
        }
        if gpu == 0:
            series[GPU_SM_ACTIVE] = rng.uniform(0, 100, ticks.size)
        for metric, values in series.items():
            agent.add_samples(metric, ticks, values, gpu=gpu)
            rows.samples += [(gpu, 0, metric, int(t), float(v)) for t, v in zip(ticks, values, strict=True)]
    for pid, (gpu, first, last) in PROCESSES.items():
        ts = T0 + np.arange(first, last + 1) * SLOW + 50 * MS
        memory = rng.integers(1 << 30, 8 << 30, ts.size).astype(float)
        share = rng.uniform(0, 60, ts.size).round(2)
        for metric, values in ((PROC_GPU_MEM, memory), (PROC_SM_UTIL, share)):
            agent.add_samples(metric, ts, values, gpu=gpu, pid=pid)
            rows.samples += [(gpu, pid, metric, int(t), float(v)) for t, v in zip(ts, values, strict=True)]
    agent.add_run("agent-node1", host=HOST, source="agent", start=T0)
    ingest.Write(request(agent), timeout=60)

    for run in RUNS:
        batch = BatchBuilder(f"run-{run.run_id}", run_id=run.run_id, host=HOST)
        batch.add_run(run.run_id, name=f"run {run.run_id}", host=HOST, start=run.start, end=run.end,
                      tags=run.tags, attrs=run.attrs)  # fmt: skip
        seen = []
        for pid in run.pids:  # first and last seen, as the launcher records its process tree
            gpu, first, last = PROCESSES[pid]
            seen.append((T0 + first * S, T0 + (last + 1) * S))
            batch.add_events("process", [seen[-1][0]], [seen[-1][1]], f"python-{pid}", pid=pid)
        ingest.Write(request(batch), timeout=60)
        rows.spans[run.run_id] = (run.start, run.end or 0)
        rows.events += seen
    for run in RUNS:  # an open run ends at its host's latest sample (+1 ns: [start, end)) or event end
        if run.end is None:
            latest = max([int(ticks[-1]) + 1] + [end for start, end in rows.events if start >= run.start])
            rows.spans[run.run_id] = (run.start, latest)

    traced = BatchBuilder("run-C", run_id="C", host="node2")
    traced.add_run("C", name="traced", host="node2", source="nsys", start=C_SPAN[0], end=C_SPAN[1],
                   tags={"model": "gpt"})  # fmt: skip
    for stream, (kind, gpu, start, end, name) in enumerate(WORK):
        traced.add_events(kind, [T0 + start * MS], [T0 + end * MS], name, gpu=gpu, stream=stream)
    ingest.Write(request(traced), timeout=60)
    rows.spans["C"] = C_SPAN

    importing = BatchBuilder("run-imp", run_id="imp", host=HOST)
    importing.add_run("imp", host=HOST, start=T0, importing=True, tags={"model": "resnet"})
    ingest.Write(request(importing), timeout=60)
    return rows


@pytest.fixture
def scene(ingest: ingest_pb2_grpc.IngestStub) -> Rows:
    return _scene(ingest)


# -- the figures, in plain Python ---------------------------------------------------------------


def _during(rows: Rows, run_id: str) -> list[tuple[int, int, str, int, float]]:
    start, end = rows.spans[run_id]
    return [row for row in rows.samples if start <= row[3] < end]


def _gpus(rows: Rows, run: Run) -> list[int]:
    if "gpus" in run.attrs:
        return [int(g) for g in run.attrs["gpus"].split(",")]
    during = _during(rows, run.run_id)
    used = {gpu for gpu, pid, *_ in during if pid in run.pids}
    return sorted(used or {gpu for gpu, pid, *_ in during if pid == 0})


def _energy(readings: list[tuple[int, float]]) -> float:
    """The counter's rise over readings (ts, joules): the non-negative steps in time order (a
    negative step is a reset)."""
    values = [value for _, value in sorted(readings)]
    return sum(max(0.0, b - a) for a, b in itertools.pairwise(values))


def expected(rows: Rows, run: Run) -> dict[str, object]:
    during = _during(rows, run.run_id)
    gpus = _gpus(rows, run)

    def device(metric: str) -> list[float]:
        return [v for g, pid, m, _, v in during if pid == 0 and m == metric and g in gpus]

    def own(metric: str) -> list[float]:
        points: dict[tuple[int, int], float] = {}  # per (gpu, instant): the sum over the run's processes
        for gpu, pid, m, ts, v in during:
            if pid in run.pids and m == metric:
                points[gpu, ts] = points.get((gpu, ts), 0.0) + v
        return list(points.values())

    util, sm_active, share, memory = device(GPU_UTIL), device(GPU_SM_ACTIVE), own(PROC_SM_UTIL), own(PROC_GPU_MEM)
    readings = ([(t, v) for g, pid, m, t, v in during if pid == 0 and m == GPU_ENERGY and g == gpu] for gpu in gpus)
    rises = [_energy(r) for r in readings if r]
    start, end = rows.spans[run.run_id]
    return {
        "gpus": len(gpus),
        "gpu_indices": ",".join(map(str, gpus)),
        "duration_s": (end - start) / 1e9,
        "energy_j": sum(rises) if rises else None,
        "gpu_util_mean": float(np.mean(util)) if util else None,
        # ClickHouse's quantileExactInclusive is numpy's default (linear) definition
        "gpu_util_p95": float(np.quantile(util, 0.95)) if util else None,
        "sm_active_mean": float(np.mean(sm_active)) if sm_active else None,
        "proc_sm_util_mean": float(np.mean(share)) if share else None,
        "gpu_mem_peak_bytes": int(max(memory)) if memory else None,
    }


def _union(intervals: list[tuple[int, int]]) -> int:
    covered, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            covered, reach = covered + end - start, end
        elif end > reach:
            covered, reach = covered + end - reach, end
    return covered


def _close(actual: Any, wanted: object) -> bool:
    if wanted is None:
        return actual is None or bool(pd.isna(actual))  # None, NaN or pd.NA
    if isinstance(wanted, float):
        return actual == pytest.approx(wanted, rel=1e-9, abs=1e-9)
    return bool(actual == wanted)


# -- tests ---------------------------------------------------------------------------------------


def test_collocated_runs_get_their_own_share(client: Client, scene: Rows) -> None:
    frame = client.compare(["B", "A", "E"])
    assert list(frame["run_id"]) == ["B", "A", "E"], "in the order named"
    assert list(frame.columns[:18]) == [
        "run_id", "name", "status", "exit_code", "start", "duration_s", "gpus", "gpu_indices", "energy_j",
        "gpu_util_mean", "gpu_util_p95", "sm_active_mean", "proc_sm_util_mean", "gpu_mem_peak_bytes", "busy_pct",
        "kernels", "top_kernels", "top_kernels_full",
    ]  # fmt: skip
    assert list(frame.columns[18:]) == ["tag.bs", "tag.extra", "tag.model"], "every tag key, sorted"
    by_id = {run.run_id: run for run in RUNS}
    for row in frame.to_dict(orient="records"):
        run = by_id[row["run_id"]]
        for column, wanted in expected(scene, run).items():
            assert _close(row[column], wanted), (run.run_id, column, row[column], wanted)
        assert row["start"].value == run.start
        assert row["status"] == run.attrs["status"]
        assert _close(row["exit_code"], int(run.attrs["exit_code"]) if "exit_code" in run.attrs else None)
        assert row["kernels"] == 0 and _close(row["busy_pct"], None) and _close(row["top_kernels"], None)
        for key in ("bs", "extra", "model"):
            assert _close(row[f"tag.{key}"], run.tags.get(key)), (run.run_id, key)

    a, b = (frame.set_index("run_id").loc[i] for i in ("A", "B"))
    # attribution: on their shared GPU, neither run's memory peak or SM share includes the other's
    # processes (nor the stranger's, pid 300); B's peak sums its two processes at one instant
    start, end = scene.spans["A"]
    a_alone = [v for g, pid, m, t, v in scene.samples if pid == 100 and m == PROC_GPU_MEM and start <= t < end]
    assert a["gpu_mem_peak_bytes"] == max(a_alone)
    everyone: dict[int, float] = {}  # every process's memory on GPU 0, per instant
    for gpu, _, m, t, v in scene.samples:
        if gpu == 0 and m == PROC_GPU_MEM and start <= t < end:
            everyone[t] = everyone.get(t, 0.0) + v
    assert a["gpu_mem_peak_bytes"] < max(everyone.values())
    assert a["gpu_indices"] == b["gpu_indices"] == "0", "A's from its process's samples, B's as declared"
    assert a["gpus"] == b["gpus"] == 1
    e = frame.set_index("run_id").loc["E"]
    assert (e["gpus"], e["gpu_indices"]) == (2, "0,1"), "no processes, nothing declared: the host's GPUs"
    assert _close(frame.set_index("run_id").loc["E", "proc_sm_util_mean"], None), "no processes of its own"


def test_traced_run_busy_union_kernels_and_top_names(client: Client, scene: Rows) -> None:
    row = client.compare(["C"], top_kernels=2).iloc[0]
    start, end = C_SPAN
    busy = {
        gpu: _union([(max(T0 + s * MS, start), min(T0 + e * MS, end)) for _, g, s, e, _ in WORK if g == gpu])
        for gpu in (0, 1)
    }
    assert busy[0] == 25 * MS, "the overlap of gemm and the long kernel counts once"
    assert row["busy_pct"] == pytest.approx(100 * sum(busy.values()) / ((end - start) * 2))
    kernels = [(name, (e - s) * MS) for kind, _, s, e, name in WORK if kind == "kernel"]
    assert row["kernels"] == len(kernels) == 4
    totals: dict[str, int] = {}
    for name, length in kernels:
        totals[name] = totals.get(name, 0) + length
    top = sorted(totals.items(), key=lambda item: -item[1])[:2]
    assert row["top_kernels_full"] == "; ".join(
        f"{name} ({100 * total / sum(totals.values()):.1f}%)" for name, total in top
    )
    assert row["top_kernels"] == "gemm (53.3%); softmax (26.7%)"
    assert len(client.compare(["C"]).iloc[0]["top_kernels"].split("; ")) == 3, "3 by default"
    third = client.compare(["C"]).iloc[0]
    assert short_name(LONG_NAME) + " (20.0%)" in third["top_kernels"], "the short name, as every table has it"
    assert LONG_NAME + " (20.0%)" in third["top_kernels_full"], "the full name, whole"
    # no telemetry on node2: those figures are empty, not 0; its GPUs are those its work ran on
    for column in ("energy_j", "gpu_util_mean", "gpu_util_p95", "proc_sm_util_mean", "gpu_mem_peak_bytes"):
        assert _close(row[column], None), column
    assert (row["gpus"], row["gpu_indices"]) == (2, "0,1")
    assert row["duration_s"] == pytest.approx(0.1) and _close(row["status"], None)


def test_open_run_ends_at_its_hosts_latest_sample(client: Client, scene: Rows) -> None:
    row = client.compare(["D"]).iloc[0]
    assert row["status"] == "running"
    assert row["duration_s"] == pytest.approx(15.0), "its process was last seen at T0 + 60 s"
    for column, wanted in expected(scene, RUNS[2]).items():
        assert _close(row[column], wanted), (column, row[column], wanted)
    assert (row["gpus"], row["gpu_indices"]) == (1, "1"), "the GPU its process used"
    assert _close(row["sm_active_mean"], None), "GPM SM activity is only sampled on GPU 0"


def test_runs_filtered_by_tags(client: Client, scene: Rows) -> None:
    assert list(client.runs(tags={"model": "resnet"})["run_id"]) == ["D", "B", "A"], "newest first, no importing run"
    assert list(client.runs(tags={"model": "resnet", "bs": "256"})["run_id"]) == ["A"], "every pair must match"
    assert client.runs(tags={"model": "bert", "bs": "256"}).empty
    assert list(client.runs(tags={"extra": ""})["run_id"]) == ["B"], "a missing key never matches ''"
    assert list(client.runs(host="node2", tags={"model": "gpt"})["run_id"]) == ["C"]


def test_compare_by_tags_after_the_runs_named(client: Client, scene: Rows) -> None:
    frame = client.compare(["C", "A"], tags={"model": "resnet"})
    assert list(frame["run_id"]) == ["C", "A", "D", "B"], "named first, then the rest newest first, each once"
    assert not frame.attrs["truncated"]
    assert list(frame["tag.model"]) == ["gpt", "resnet", "resnet", "resnet"]
    assert list(client.compare(tags={"model": "bert"})["run_id"]) == ["E"]
    assert client.compare(tags={"model": "nobody"}).empty


@pytest.mark.parametrize(
    "call, code, words",
    [
        (lambda c: c.compare(["A", "nope"]), "NOT_FOUND", "'nope'"),
        (lambda c: c.compare(["imp"]), "NOT_FOUND", "'imp' is still being imported"),
        (lambda c: c.compare(), "INVALID_ARGUMENT", "run_ids"),
        (lambda c: c.compare([f"r{i}" for i in range(1001)]), "INVALID_ARGUMENT", "run_ids"),
        (lambda c: c.compare(["A"], top_kernels=101), "INVALID_ARGUMENT", "top_kernels"),
        (lambda c: c.compare(tags={"": "x"}), "INVALID_ARGUMENT", "tags"),
        (lambda c: c.runs(tags={"k" * 257: "x"}), "INVALID_ARGUMENT", "tags"),
        (lambda c: c.runs(tags={"k": "x" * (64 << 10 | 1)}), "INVALID_ARGUMENT", "tags['k']"),
        (lambda c: c.runs(tags={f"k{i}": "x" for i in range(257)}), "INVALID_ARGUMENT", "tags"),
    ],
)
def test_refusals(client: Client, scene: Rows, call, code: str, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(QueryFailed) as caught:
        call(client)
    assert caught.value.code.name == code and words in caught.value.message, caught.value.message


def test_cli_compare_csv_is_one_row_per_run(client: Client, scene: Rows, address: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert main(["query", "compare", "A", "B", "--format", "csv", "--server", address]) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    header, rows = table[0], table[1:]
    assert [row[0] for row in rows] == ["A", "B"] and all(len(row) == len(header) for row in rows)
    for run, row in zip(RUNS[:2], (dict(zip(header, row, strict=True)) for row in rows), strict=True):
        assert int(row["start"]) == run.start, "times as integer ns"
        assert int(row["exit_code"]) == int(run.attrs["exit_code"]) and row["kernels"] == "0"
        assert row["busy_pct"] == "" and row["tag.bs"] == run.tags["bs"]
        for column, wanted in expected(scene, run).items():
            if isinstance(wanted, float):
                assert float(row[column]) == pytest.approx(wanted, rel=1e-12), column
            else:
                assert row[column] == str(wanted), column

    assert main(["query", "compare", "--server", address]) == 2
    assert "--tag" in capsys.readouterr().err
    assert main(["query", "compare", "--tag", "model=gpt", "--format", "json", "--server", address]) == 0
    assert '"run_id": "C"' in capsys.readouterr().out
    assert main(["query", "runs", "--tag", "model=resnet", "--tag", "bs=512", "--format", "csv", "--server",
                 address]) == 0  # fmt: skip
    out = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["run_id"] for row in out] == ["B"]
    assert main(["query", "compare", "nope", "--server", address]) == 2
    assert "NOT_FOUND" in capsys.readouterr().err


# -- GPUs and energy, each on a host of its own ---------------------------------------------------


def _telemetry(ingest: ingest_pb2_grpc.IngestStub, agent: str, host: str,
               series: dict[tuple[int, str], list[tuple[int, float]]]) -> None:  # fmt: skip
    """Samples of one agent (run id `agent`): per (gpu, metric) the readings (ts, value)."""
    batch = BatchBuilder(f"{agent}-samples", run_id=agent, host=host)
    for (gpu, metric), readings in series.items():
        batch.add_samples(metric, [t for t, _ in readings], [v for _, v in readings], gpu=gpu)
    ingest.Write(request(batch), timeout=60)


def _describe(ingest: ingest_pb2_grpc.IngestStub, run_id: str, host: str, source: str, start: int, end: int,
              attrs: dict[str, str]) -> None:  # fmt: skip
    batch = BatchBuilder(f"run-{run_id}", run_id=run_id, host=host)
    batch.add_run(run_id, name=run_id, host=host, source=source, start=start, end=end, attrs=attrs)
    if source in ("nsys", "kineto"):
        batch.add_events("kernel", [start + MS], [start + 2 * MS], "gemm", gpu=1, stream=7)
    ingest.Write(request(batch), timeout=60)


def _counters(ticks: np.ndarray) -> dict[tuple[int, str], list[tuple[int, float]]]:
    """Utilisation and an energy counter with its own origin and slope on GPUs 0 and 1."""
    series: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for gpu in (0, 1):
        series[gpu, GPU_UTIL] = [(int(t), float(10 * gpu + i % 7)) for i, t in enumerate(ticks)]
        series[gpu, GPU_ENERGY] = [(int(t), 1e5 * (gpu + 1) + (gpu + 3) * i) for i, t in enumerate(ticks)]
    return series


def _inside(readings: list[tuple[int, float]], start: int, end: int) -> list[tuple[int, float]]:
    return [(t, v) for t, v in readings if start <= t < end]


@pytest.mark.parametrize("source", ["agent", "nsys", "kineto"])
def test_a_gpu_count_is_not_a_list_of_gpus(client: Client, ingest: ingest_pb2_grpc.IngestStub, source: str) -> None:
    """Agents and importers store how many GPUs they saw in `gpus`: "2" is not GPU 2. Such a run
    gets its host's GPUs with samples, and their energy and utilisation."""
    host, start, end = "node3", T0 + S, T0 + 3 * S
    series = _counters(np.arange(T0, T0 + 4 * S, TICK))
    _telemetry(ingest, "agent-node3", host, series)
    run_id = "agent-node3" if source == "agent" else f"{source}-run"
    _describe(ingest, run_id, host, source, start, end, {"gpus": "2"})
    _describe(ingest, f"{source}-elsewhere", "node4", source, start, end, {"gpus": "2"})  # no telemetry there

    frame = client.compare([run_id, f"{source}-elsewhere"]).set_index("run_id")
    row = frame.loc[run_id]
    assert (row["gpus"], row["gpu_indices"]) == (2, "0,1"), "the host's GPUs with samples, not GPU 2"
    wanted = sum(_energy(_inside(series[gpu, GPU_ENERGY], start, end)) for gpu in (0, 1))
    assert wanted > 0 and row["energy_j"] == pytest.approx(wanted)
    util = [v for gpu in (0, 1) for _, v in _inside(series[gpu, GPU_UTIL], start, end)]
    assert row["gpu_util_mean"] == pytest.approx(float(np.mean(util)))
    elsewhere = frame.loc[f"{source}-elsewhere"]
    assert elsewhere["gpus"] == 2 and _close(elsewhere["gpu_indices"], None), "a count is never shown as GPUs"


@pytest.mark.parametrize(
    "declared, gpus",
    [("5000", "0,1"), ("0,40000", "0,1"), ("4096", "0,1"), ("0,\u00b2", "0,1"), ("9" * 5000, "0,1"), ("4095", "4095")],
    ids=["5000", "0,40000", "4096", "0,superscript-2", "5000-digits", "4095"],
)
def test_gpu_indices_past_the_limit_are_unknown(client: Client, ingest: ingest_pb2_grpc.IngestStub, declared: str,
                                                gpus: str) -> None:  # fmt: skip
    """GPU indices run 0..4095 (DEFAULT_LIMITS.max_gpu_index): a `gpus` attribute naming one past
    that (or a digit that is not ASCII, "²") is not a list of the run's GPUs, and the run gets its
    host's GPUs with samples."""
    host, start, end = "node5", T0 + S, T0 + 3 * S
    series = _counters(np.arange(T0, T0 + 4 * S, TICK))
    _telemetry(ingest, "agent-node5", host, series)
    _describe(ingest, "declared", host, "user", start, end, {"gpus": declared})
    row = client.compare(["declared"]).iloc[0]
    assert row["gpu_indices"] == gpus and row["gpus"] == len(gpus.split(","))
    if gpus == "0,1":
        wanted = sum(_energy(_inside(series[gpu, GPU_ENERGY], start, end)) for gpu in (0, 1))
        assert row["energy_j"] == pytest.approx(wanted)
    else:
        assert _close(row["energy_j"], None), "a GPU without samples has no energy"


def test_energy_counter_reset_counts_only_rises(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    """A driver reload restarts the counter near 0: a negative step adds nothing, and what the
    counter rose on either side of it counts."""
    host, start, end = "node6", T0 + S, T0 + 5 * S
    readings = [(T0 + S, 100.0), (T0 + 2 * S, 150.0), (T0 + 3 * S, 5.0), (T0 + 4 * S, 25.0)]
    outside = [(T0, 90.0), (T0 + 5 * S, 1000.0)]  # before and at the run's end: not its own
    # written out of time order: the steps are taken in time order whatever the order stored
    _telemetry(ingest, "agent-node6", host, {(0, GPU_ENERGY): readings[2:] + outside + readings[:2]})
    _describe(ingest, "reset", host, "user", start, end, {"gpus": "0"})
    assert _energy(readings) == 70.0
    assert client.compare(["reset"]).iloc[0]["energy_j"] == pytest.approx(70.0), "50 + 20, not 150 - 5"


def test_two_agents_on_one_gpu_are_not_mixed(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> None:
    """Two agents on one host (each its own run id and counter origin) both sample its GPUs: per
    GPU, the energy is that of the series with the most readings, never a mix of the two nor their
    sum."""
    host, start, end = "node7", T0, T0 + 10 * S
    x = {(0, GPU_ENERGY): [(T0 + i * S, 1000.0 + 10 * i) for i in range(4)],  # 30 J in 4 readings
         (1, GPU_ENERGY): [(T0 + i * S, 7000.0 + 100 * i) for i in range(2)]}  # 100 J in 2 readings  # fmt: skip
    y = {(0, GPU_ENERGY): [(T0 + i * S + MS, 5.0 + 7 * i) for i in range(3)],  # 14 J in 3 readings
         (1, GPU_ENERGY): [(T0 + i * S + MS, 3.0 + 3 * i) for i in range(3)]}  # 6 J in 3 readings  # fmt: skip
    _telemetry(ingest, "agent-x", host, x)
    _telemetry(ingest, "agent-y", host, y)
    _describe(ingest, "shared", host, "user", start, end, {})
    row = client.compare(["shared"]).iloc[0]
    assert (row["gpus"], row["gpu_indices"]) == (2, "0,1")
    assert row["energy_j"] == pytest.approx(_energy(x[0, GPU_ENERGY]) + _energy(y[1, GPU_ENERGY])) == 36.0


def test_a_runs_gpus_are_those_it_registered_even_when_a_later_run_registers_them_again(
    client: Client, ingest: ingest_pb2_grpc.IngestStub
) -> None:
    """Two imports of one host's GPU 0 and the host's agent (GPUs 0 and 1): the devices table
    keeps one row per GPU, naming the run that described it last. Each run still has the GPUs
    it recorded: the imports one (GPU 0, where their work ran), the agent two; their telemetry
    figures are those of their own GPUs."""
    host = "node8"
    series = _counters(np.arange(T0, T0 + 30 * S, TICK))
    _telemetry(ingest, "agent-node8", host, series)
    agent = BatchBuilder("agent-node8-run", run_id="agent-node8", host=host)
    agent.add_run("agent-node8", host=host, source="agent", start=T0, end=T0 + 30 * S, attrs={"gpus": "2"})
    for gpu in (0, 1):
        agent.add_device(host, gpu, uuid=f"GPU-{gpu}", name="sampled", run_id="agent-node8")
    ingest.Write(request(agent), timeout=60)
    for number, run_id in enumerate(("nsys-early", "nsys-late")):
        start = T0 + (1 + 10 * number) * S
        batch = BatchBuilder(f"run-{run_id}", run_id=run_id, host=host)
        batch.add_run(run_id, host=host, source="nsys", start=start, end=start + 5 * S, attrs={"gpus": "1"})
        batch.add_device(host, 0, uuid="GPU-0", name="traced", run_id=run_id)
        batch.add_events("kernel", [start + MS], [start + 2 * MS], "gemm", gpu=0, stream=7)
        ingest.Write(request(batch), timeout=60)
    owners = client.devices(host).set_index("gpu")["run_id"].to_dict()
    assert owners == {0: "nsys-late", 1: "agent-node8"}, "one row per GPU: earlier registrations are gone"

    frame = client.compare(["nsys-early", "nsys-late", "agent-node8"]).set_index("run_id")
    assert frame["gpus"].tolist() == [1, 1, 2]
    assert frame["gpu_indices"].tolist() == ["0", "0", "0,1"]
    start, end = T0 + S, T0 + 6 * S
    assert frame.loc["nsys-early", "energy_j"] == pytest.approx(_energy(_inside(series[0, GPU_ENERGY], start, end)))


def test_the_demo_runs_have_the_one_gpu_their_traces_profile(address: str, client: Client) -> None:
    """`up --demo`: each trace profiles the host's simulated GPU 0, the one `up`'s agent samples
    as GPU 0 (the same UUID): each run has one GPU, and every answer says so."""
    from agent.telemetry.simulated import SimulatedBackend
    from tracehouse.cli.demo import load_demo

    results = load_demo(address, "demo-host", END + 120 * S, gpus=2)
    runs = [result.run_id for result in results]
    [traced] = client.devices("demo-host").to_dict("records")
    sampled = SimulatedBackend(2).devices()[0]
    assert (traced["gpu"], traced["uuid"], traced["name"]) == (0, sampled.uuid, sampled.name)
    frame = client.compare(runs)
    assert frame["gpus"].tolist() == [1, 1] and frame["gpu_indices"].tolist() == ["0", "0"]
    listed = client.runs(host="demo-host").set_index("run_id")
    assert [listed.loc[run, "attrs"]["gpus"] for run in runs] == ["1", "1"]
