"""`tracehouse verdict` on real traces (../shared/fixtures), read as printed: a run with steps beside one
without, windows that cover each run whole, a refusal whose command works when pasted, the evidence said
right for two runs against one, names as every table has them, no float noise below the clock."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pandas as pd
import pytest

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from query import verdict_text
from query.client import Client
from tests.conftest import FIXTURES
from tests.helpers import imported_runs, run_cli
from tracehouse.cli.main import main
from tracehouse.cli.options import command_name

STEPS_TRACE = FIXTURES / "kineto" / "trace_filter_sampled_rank-0.json.gz"  # 2 ProfilerSteps, 1154 kernels
MORE_STEPS = FIXTURES / "kineto" / "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # 5 steps
ONE_STEP = FIXTURES / "kineto" / "critical_path_cuda_event_sync_event_sync_trace.json.gz"  # 1 step, 3.3 ms
NO_STEPS = FIXTURES / "nsys" / "nsys-2024.5-pipit-cloverleaf-4xa100.sqlite"  # 887 ms, 4 GPUs, no steps
LONG = FIXTURES / "kineto" / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"  # 43.5 s
NVTX = FIXTURES / "nsys" / "nsys-2022.2-pipit-saxpy-mpi-cuda.sqlite"  # no steps; MPI:MPI_Send 10 times, saxpy 5


@pytest.fixture
def imported(address: str) -> Iterator[dict[str, str]]:
    """The fixtures' run ids, by their short names here."""
    files = {"steps": STEPS_TRACE, "more": MORE_STEPS, "one": ONE_STEP, "none": NO_STEPS, "long": LONG, "nvtx": NVTX}
    yield from imported_runs(address, files)


def test_a_run_with_steps_beside_one_without_is_compared_in_windows_and_the_pasted_hint_tells(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str]
) -> None:
    code, out, err = run_cli(capsys, "verdict", imported["steps"], imported["none"], "--server", address)
    assert code == 0, err
    assert "Nothing to compare" not in out, out
    headline = out.splitlines()[0]
    assert headline.startswith("B vs A: too noisy to tell: GPU busy"), out
    assert "one run each side (1 and 1 windows)" in headline
    assert "GPU busy" in out and "windows A/B" in out and "1 window of 1.23 s" in out and "1 window of 887 ms" in out
    assert "Where the step time went" not in out, "windows have no parts"
    assert "has no steps" in err and "--steps REGEX" in err
    lines = out.splitlines()
    said = next(i for i, line in enumerate(lines) if line.startswith("Too few windows"))
    assert "--steps REGEX" in lines[said]
    pasted = lines[said + 1].strip()
    assert pasted.startswith(command_name() + " verdict ") and pasted.endswith("--window 20ms"), pasted
    code, again, err = run_cli(capsys, *shlex.split(pasted[len(command_name()) :]))
    assert code == 0, err
    assert "95 % interval" in again.splitlines()[0] and "Too few windows" not in again, again
    assert "62 windows of 19.8 ms" in again and "44 windows of 20.2 ms" in again


def test_a_run_that_repeats_an_nvtx_range_is_offered_it_as_steps_and_the_pasted_command_measures_step_time(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str]
) -> None:
    code, out, err = run_cli(capsys, "verdict", imported["steps"], imported["nvtx"], "--server", address)
    assert code == 0, err
    lines = out.splitlines()
    said = next(i for i, line in enumerate(lines) if line.startswith("Runs without steps repeat"))
    assert "MPI:MPI_Send" in lines[said] and "step time is measured too" in lines[said]
    pasted = lines[said + 1].strip()
    assert pasted.endswith("--steps '^MPI:MPI_Send$'"), pasted
    code, again, err = run_cli(capsys, *shlex.split(pasted[len(command_name()) :]))
    assert code == 0, err
    assert "step time" in again.splitlines()[0] and "NVTX ranges matching '^MPI:MPI_Send$'" in again
    assert "Runs without steps" not in again and "has no steps" not in err


def test_windows_cover_each_run_whole_so_its_busy_is_the_whole_runs(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str], client: Client
) -> None:
    """alexnet lasts 43.5 s: 10 s windows used to leave out its last 3.5 s and the work in them."""
    code, out, err = run_cli(
        capsys, "verdict", imported["long"], imported["none"], "--server", address, "--format", "json"
    )
    assert code == 0, err
    answer = json.loads(out)
    for row in answer["runs"]:
        assert row["steps"] * row["mean_step_ns"] == pytest.approx(row["span_ns"], abs=1), "windows cover the run"
    assert [row["steps"] for row in answer["runs"]] == [4, 1]  # 43.5 s in 4 of 10.9 s; 887 ms in one
    busy = {
        row["run_id"]: row["busy_pct"]
        for row in client.compare([imported["long"], imported["none"]]).to_dict("records")
    }
    measured = {row["measure"]: row for row in answer["measures"]}["gpu_busy"]
    assert measured["a"] == pytest.approx(busy[imported["long"]], rel=1e-9)
    assert measured["b"] == pytest.approx(busy[imported["none"]], rel=1e-9)
    assert measured["per"] == "window" and not {"step_time", "throughput"} & {r["measure"] for r in answer["measures"]}


def test_two_runs_against_one_are_said_so_and_parts_read_by_their_short_names(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str]
) -> None:
    code, out, err = run_cli(capsys, "verdict", f"{imported['steps']},{imported['more']}", imported["one"],
                         "--server", address)  # fmt: skip
    assert code == 0, err
    headline = out.splitlines()[0]
    assert "one run each side" not in headline, headline
    assert "2 runs of A and one run of B (7 and 1 steps): run-to-run spread not measured for B" in headline
    parts = out[out.index("Where the step time went") :].split("\n\n")[0].splitlines()[2:]
    assert all("…" not in line.split("  ")[0] or line.split("  ")[0].endswith(("(…)", ">", "…")) for line in parts)
    assert all(line.rstrip().endswith(("µs", "ms", "ns", "s", "")) for line in parts)
    code, full, _ = run_cli(capsys, "verdict", f"{imported['steps']},{imported['more']}", imported["one"],
                        "--server", address, "--full-names")  # fmt: skip
    with Client(address, timeout=60) as client:
        named = client.verdict([imported["steps"], imported["more"]], [imported["one"]])["parts"]["part"].head(10)
    assert all(name in full for name in named), "--full-names prints every part whole"
    short = verdict_text.parts_rows(pd.DataFrame({"part": named, "a_ns": 1.0, "b_ns": 1.0, "delta_ns": 0.0,
                                                  "low_ns": None, "high_ns": None}))["part"]  # fmt: skip
    assert all(label in out for label in short.iloc[:-1]), "the table's labels are the short names"


def test_help_reads_95_percent_once_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["verdict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "95 % interval" in text and "%%" not in text


def test_a_difference_below_the_clock_is_zero() -> None:
    """Sums of parts in float leave -0.000000571 ns where B and A took the same time."""
    parts = pd.DataFrame({"part": ["kernel", "GPU idle, host elsewhere"], "a_ns": [5e9, 5e9],
                          "b_ns": [5e9 - 1e-7, 5e9 - 4.71e-7], "delta_ns": [-1e-7, -4.71e-7],
                          "low_ns": [None, None], "high_ns": [None, None]})  # fmt: skip
    rows = verdict_text.parts_rows(parts)
    assert list(rows["B - A"]) == ["0 ns", "0 ns", "0 ns"]


def test_runs_with_nothing_to_measure_are_refused_with_why_and_no_window_that_cannot_help(
    capsys: pytest.CaptureFixture[str], address: str
) -> None:
    ranges_only = FIXTURES / "nsys" / "nsys-2022.4-efficientcenterformer-nvtx.sqlite"  # NVTX ranges, no GPU work
    api_only = FIXTURES / "nsys" / "nsys-2025.1-lighttransport-gemm.sqlite"  # 3 CUDA API calls
    if not (ranges_only.exists() and api_only.exists()):
        pytest.skip("fixtures absent")
    writer = BatchWriter(address, patience=120)
    try:
        a, b = (import_export(path, writer).run_id for path in (ranges_only, api_only))
    finally:
        writer.close()
    code, out, err = run_cli(capsys, "verdict", a, b, "--server", address)
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith("Nothing to compare: no GPU work in nsys-2022.4-efficientcenterformer-nvtx, "
                            "nsys-2025.1-lighttransport-gemm; no steps in "), first  # fmt: skip
    assert "(--steps REGEX names NVTX ranges as steps)" in first
    assert "--window" not in out and "(no rows)" not in out, "finer windows of no work measure nothing"
