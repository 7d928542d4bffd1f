"""One window per run, said and kept, on real files of ../shared/fixtures: a relative-time Nsight export
(nsys 2021.2, no session start) gets the same busy % from gpu-time, gpu-time --from/--to over its span and
compare, and its times print as offsets from its start, never 1970 dates; the profiler-step window of a
Kineto trace (gpu-time --over profiler-steps) is checked by hand against the JSON (json.load)."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from query.client import Client
from query.stepwindow import step_window
from tests.conftest import FIXTURES
from tests.helpers import run_cli
from tracehouse.timefmt import format_instant, format_offset

RELATIVE = FIXTURES / "nsys" / "nsys-2021.2-mordred-report1.sqlite"
STEPPED = [FIXTURES / "kineto" / name for name in (
    "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "trace_filter_sampled_rank-0.json.gz",
    "critical_path_cuda_event_sync_event_sync_trace.json.gz",
)]  # fmt: skip
DATE = re.compile(r"\b(19|20)\d\d-\d\d-\d\d\b")
WORK = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
CALLS = {"cuda_runtime", "cuda_driver", "Runtime"}


@pytest.fixture
def writer(address: str) -> Iterator[BatchWriter]:
    opened = BatchWriter(address, patience=60)
    yield opened
    opened.close()


def test_offsets_read_from_the_origin() -> None:
    assert format_offset(3_362_000_000) == "+3.362 s" == format_instant(3_362_000_000, wall_clock=False)
    assert format_instant(3_362_000_000 + 5, wall_clock=False, origin_ns=5) == "+3.362 s"
    assert format_offset(-12_500) == "-12.500 µs" and format_offset(40) == "+40 ns"
    assert format_instant(1_790_000_000_123_456_789) == "2026-09-21 14:13:20.123 UTC"


@pytest.mark.skipif(not RELATIVE.exists(), reason="the relative-time nsys export is not in the fixtures")
def test_a_relative_time_run_has_one_window_and_prints_offsets(
    capsys: pytest.CaptureFixture[str], address: str, writer: BatchWriter, client: Client
) -> None:
    result = import_export(RELATIVE, writer)
    assert result.relative_time
    run_id = result.run_id
    (row,) = client.runs(name_contains=run_id).to_dict(orient="records")
    start, end = int(row["start"].value), int(row["end"].value)
    server = ("--server", address)

    def busy(*argv: str) -> dict[str, Any]:
        code, out, err = run_cli(capsys, "query", "gpu-time", *argv, *server, "--format", "json")
        assert code == 0, err
        (gpu,) = json.loads(out)["gpus"]
        return dict(gpu)

    whole = busy("--run", run_id)
    assert (whole["span_start_ns"], whole["span_end_ns"], whole["window"]) == (start, end, "run")
    given = busy("--run", run_id, "--from", str(start), "--to", str(end))
    assert given["busy_pct"] == whole["busy_pct"] and given["window"].startswith("from-to")
    code, out, err = run_cli(capsys, "query", "compare", run_id, *server, "--format", "json")
    assert code == 0, err
    assert json.loads(out)[0]["busy_pct"] == pytest.approx(whole["busy_pct"], rel=1e-12)
    assert whole["busy_ns"] * 100 / (end - start) == pytest.approx(whole["busy_pct"], rel=1e-12)

    for argv in (("gpu-time", "--run", run_id), ("events", "--run", run_id, "--limit", "50"),
                 ("kernels", "--run", run_id), ("compare", run_id)):  # fmt: skip
        code, out, err = run_cli(capsys, "query", *argv, *server)
        assert code == 0, err
        assert "1970" not in out and not DATE.search(out), out
    code, out, _ = run_cli(capsys, "query", "gpu-time", "--run", run_id, *server)
    assert f"{format_offset(end - start)}" in out and "+0 ns" in out and "run" in out
    code, out, _ = run_cli(capsys, "query", "compare", run_id, *server)
    assert "no wall clock" in out
    code, out, _ = run_cli(capsys, "query", "gpu-time", "--run", run_id, *server, "--format", "csv")
    assert str(end) in out, "csv keeps exact ns"


# -- the profiler-step window by hand --------------------------------------------------------------


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as file:
        trace: dict[str, Any] = json.load(file, parse_float=Decimal)
    return trace


def ns(us: int | Decimal) -> int:
    return int((Decimal(us) * 1000).to_integral_value())


def union_within(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """The length of the union of `intervals` clipped to [lo, hi)."""
    total, reach = 0, lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if s > reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def by_hand(trace: dict[str, Any]) -> tuple[int, int, dict[int, int]]:
    """(window start, end, busy ns per GPU): the GPU work launched from inside a ProfilerStep#N (its CUDA
    call on the step's thread, while the step ran), first start to last end; busy is the union of every
    piece of GPU work on each GPU inside it."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = defaultdict(list)
    for event in events:
        if event.get("cat") == "user_annotation" and str(event.get("name", "")).startswith("ProfilerStep#"):
            start = ns(event["ts"])
            steps[(event["pid"], event["tid"])].append((start, start + ns(event["dur"])))
    calls = {
        e["args"]["correlation"]: e for e in events if e.get("cat") in CALLS and "correlation" in e.get("args", {})
    }
    work: dict[int, list[tuple[int, int]]] = defaultdict(list)
    launched: list[tuple[int, int]] = []
    for event in (e for e in events if e.get("cat") in WORK):
        start = ns(event["ts"])
        interval = (start, start + ns(event["dur"]))
        work[event["args"].get("device", event["pid"])].append(interval)
        call = calls.get(event["args"].get("correlation"))
        if call is None:
            continue
        at = ns(call["ts"])
        if any(s <= at < e for s, e in steps.get((call["pid"], call["tid"]), ())):
            launched.append(interval)
    lo, hi = min(s for s, _ in launched), max(e for _, e in launched)
    return lo, hi, {gpu: union_within(intervals, lo, hi) for gpu, intervals in work.items()}


@pytest.mark.parametrize("path", [p for p in STEPPED if p.exists()], ids=lambda p: p.name[:24])
def test_busy_over_the_profiler_steps_is_the_json_s(
    path: Path, capsys: pytest.CaptureFixture[str], address: str, writer: BatchWriter
) -> None:
    run_id = import_export(path, writer).run_id
    lo, hi, busy = by_hand(load(path))
    server = ("--server", address)
    code, out, err = run_cli(capsys, "query", "gpu-time", "--run", run_id, "--over", "profiler-steps", *server,
                         "--format", "json")  # fmt: skip
    assert code == 0, err
    gpus = json.loads(out)["gpus"]
    assert {gpu["gpu"]: gpu["busy_ns"] for gpu in gpus} == {g: b for g, b in busy.items() if b}
    for gpu in gpus:
        assert (gpu["span_start_ns"], gpu["span_end_ns"]) == (lo, hi)
        assert gpu["busy_pct"] == pytest.approx(100 * busy[gpu["gpu"]] / (hi - lo), rel=1e-12)
        assert gpu["window"].startswith("profiler-steps (")
    code, out, err = run_cli(capsys, "query", "gpu-time", "--run", run_id, "--over", "profiler-steps", *server)
    assert code == 0 and "profiler-steps (" in out, err
    code, out, err = run_cli(capsys, "query", "gpu-time", "--run", run_id, *server, "--format", "json")
    assert code == 0 and {gpu["window"] for gpu in json.loads(out)["gpus"]} == {"run"}


@pytest.mark.skipif(not RELATIVE.exists(), reason="the relative-time nsys export is not in the fixtures")
def test_profiler_steps_refused_where_a_run_has_none(
    capsys: pytest.CaptureFixture[str], address: str, writer: BatchWriter
) -> None:
    run_id = import_export(RELATIVE, writer).run_id
    code, _, err = run_cli(
        capsys, "query", "gpu-time", "--run", run_id, "--over", "profiler-steps", "--server", address
    )
    assert code == 2 and "has no profiler steps on the GPU" in err and "leave out --over" in err
    code, _, err = run_cli(capsys, "query", "gpu-time", "--over", "profiler-steps", "--server", address)
    assert code == 2 and "--run RUN" in err
    code, _, err = run_cli(capsys, "query", "gpu-time", "--run", run_id, "--over", "profiler-steps", "--from", "0",
                       "--server", address)  # fmt: skip
    assert code == 2 and "leave out --from" in err


def test_gpu_side_annotations_win_over_projected_steps() -> None:
    import pandas as pd

    annotations = pd.DataFrame({"name": ["ProfilerStep#3", "ProfilerStep#4", "other"],
                                "start": [100, 200, 0], "end": [180, 290, 1000]})  # fmt: skip
    ranges = pd.DataFrame({"kind": ["step"], "gpu_start_ns": [50], "gpu_end_ns": [400]})
    found = step_window(annotations, ranges)
    assert found is not None and (found.start_ns, found.end_ns, found.steps) == (100, 290, 2)
    found = step_window(annotations.iloc[2:], ranges)
    assert found is not None and (found.start_ns, found.end_ns, found.found_from) == (50, 400, "projected")
    assert step_window(annotations.iloc[2:], ranges.iloc[0:0]) is None
