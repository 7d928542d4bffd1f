"""`tracehouse query` and `import` at their edges, on real traces (../shared/fixtures), read as printed: one
short name per kernel in every table and sentence, the full name one flag away; ranges stored as profiler
steps; SQL refusals that name the real columns; ns columns read as durations by a stated rule; a file stored
already said so; formats named when a file is refused; up's torch hint as a command that pastes."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from query.client import Client
from tests.conftest import FIXTURES
from tests.helpers import imported_runs, run_cli
from tracehouse.cli.options import command_name
from tracehouse.cli.up import torch_hint
from tracehouse.shortnames import short_name

SAXPY = FIXTURES / "nsys" / "nsys-2022.2-pipit-saxpy-mpi-cuda.sqlite"  # NVTX ranges over GPU work
STEPS = FIXTURES / "kineto" / "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # #101..#105
CUTLASS = FIXTURES / "kineto" / "trace_filter_sampled_rank-0.json.gz"
SHARE = re.compile(r" \(\d+\.\d%\)$")


@pytest.fixture
def imported(address: str) -> Iterator[dict[str, str]]:
    files = {"saxpy": SAXPY, "steps": STEPS, "cutlass": CUTLASS}
    yield from imported_runs(address, files)


def _kernel_labels(out: str) -> set[str]:
    lines = out.splitlines()
    end = lines[0].index("instances")
    return {line[:end].strip() for line in lines[1:]}


def test_a_kernel_reads_the_same_in_kernels_compare_and_the_headline_and_whole_with_full_names(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str], client: Client
) -> None:
    """A kernel's label is its short name wherever no other name of the same table reads the same; only
    namesakes are opened where they differ (so `query kernels` may open one that compare's top 3 need not)."""
    a, b = imported["steps"], imported["cutlass"]
    tables, namesakes = {}, set()
    for run_id in (a, b):
        code, out, err = run_cli(capsys, "query", "kernels", "--run", run_id, "--server", address)
        assert code == 0, err
        tables[run_id] = _kernel_labels(out)
        names = client.summary("kernels", run=run_id)["name"]
        shorts = names.map(short_name)
        namesakes |= set(names[shorts.duplicated(keep=False)])
        assert {short_name(n) for n in names if n not in namesakes} <= tables[run_id], "the short name, as is"
    code, out, err = run_cli(capsys, "query", "compare", a, b, "--server", address)
    assert code == 0, err
    frame = client.compare([a, b])
    for row in frame.to_dict("records"):
        full = [SHARE.sub("", item) for item in row["top_kernels_full"].split("; ")]
        for name, shown in zip(full, row["top_kernels"].split("; "), strict=True):
            assert SHARE.search(shown), f"the share is kept: {shown!r}"
            assert shown in out, "printed whole, share and all"
            if name not in namesakes:
                assert SHARE.sub("", shown) == short_name(name) and short_name(name) in tables[row["run_id"]]
    biggest = out.splitlines()[0].split("Biggest changes: ")[1]
    named = [n for n in client.diff(a, b)["name"].head(3)]
    assert all(short_name(name) in biggest for name in named), "the headline names kernels as the tables do"
    code, wide, _ = run_cli(capsys, "query", "compare", a, b, "--server", address, "--full-names")
    assert code == 0 and all(name in wide for row in frame.to_dict("records")
                             for name in (SHARE.sub("", i) for i in row["top_kernels_full"].split("; ")))  # fmt: skip


def test_nvtx_gpu_prints_ranges_only_when_asked(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str]
) -> None:
    code, out, err = run_cli(capsys, "query", "nvtx-gpu", "--run", imported["saxpy"], "--server", address)
    assert code == 0, err
    assert "# ranges" not in out and "(no rows)" not in out and "saxpy" in out
    code, out, err = run_cli(
        capsys, "query", "nvtx-gpu", "--run", imported["saxpy"], "--ranges", "3", "--server", address
    )
    assert code == 0 and "# ranges" in out, err


def test_a_profiler_step_is_found_among_steps_and_a_missing_one_hints_the_steps_there_are(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str], client: Client
) -> None:
    run_id = imported["steps"]
    code, out, err = run_cli(
        capsys, "query", "kernels", "--run", run_id, "--range", "ProfilerStep#103", "--server", address
    )
    assert code == 0, err
    steps = client.events(["step"], run=run_id)
    third = steps[steps["extras"].map(lambda extras: dict(extras).get("step")) == "103"].iloc[0]
    inside = client.summary("kernels", run=run_id, start=int(third["start"].value), end=int(third["end"].value))
    assert len(out.splitlines()) == 1 + len(inside) > 1
    code, out, err = run_cli(
        capsys, "query", "kernels", "--run", run_id, "--range", "ProfilerStep#6", "--server", address
    )
    assert code == 2 and "NOT_FOUND" in err
    hint = err.splitlines()[-1]
    assert "ProfilerStep#101, #102, #103, #104, #105" in hint, hint
    pasted = hint[hint.index(command_name() + " ") :]
    code, again, err = run_cli(capsys, *shlex.split(pasted[len(command_name()) :]))
    assert code == 0 and again.strip(), err


def test_sql_refusals_name_the_real_columns_and_their_types(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str]
) -> None:
    for sql, said in (
        ("SELECT end_ns FROM events LIMIT 1", "`end_ns`"),
        ("DESCRIBE events", "not DESCRIBE"),
    ):
        code, _, err = run_cli(capsys, "query", "sql", sql, "--server", address)
        assert code == 2 and said in err, err
        assert "The columns of events: run_id" in err and "start DateTime64(9" in err and "end DateTime64(9" in err
        assert "toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start) AS duration_ns" in err
    code, _, err = run_cli(capsys, "query", "sql", "SELECT id FROM runs", "--server", address)
    assert code == 2 and "The columns of runs: run_id String" in err, err


def test_ns_columns_read_as_durations_by_type_or_name_and_others_are_told_how(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str]
) -> None:
    span = "toIntervalNanosecond(toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start))"
    sql = (f"SELECT end - start AS took, {span} AS span, dateDiff('ns', start, end) AS raw, raw AS raw_ns "
           f"FROM events WHERE run_id = '{imported['saxpy']}' AND kind = 'kernel' ORDER BY start LIMIT 1")  # fmt: skip
    code, out, err = run_cli(capsys, "query", "sql", sql, "--server", address)
    assert code == 0, err
    header, row = out.splitlines()
    cells = row.split()
    assert re.fullmatch(r"took\s+span\s+raw\s+raw_ns", header.strip()), header
    assert cells[1] in ("ms", "µs") and cells[3] in ("ms", "µs") and cells[6] in ("ms", "µs"), row
    assert cells[4].isdigit(), "a plain integer named otherwise stays a number"
    assert "raw: plain number" in err and "AS raw_ns" in err
    code, data, _ = run_cli(capsys, "query", "sql", sql, "--server", address, "--format", "json")
    assert code == 0 and '"span": ' in data and isinstance(eval(data.replace("null", "None"))[0]["span"], int)


def test_reimporting_says_it_is_stored_already(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[str, str]
) -> None:
    code, out, err = run_cli(capsys, "import", str(SAXPY), "--server", address)
    assert code == 0, err
    assert f"stored already, as run {imported['saxpy']} (imported before): nothing new was stored" in err
    assert imported["saxpy"] in out


def test_a_csv_is_refused_naming_the_formats_imported(
    capsys: pytest.CaptureFixture[str], address: str, tmp_path: Path
) -> None:
    path = tmp_path / "kernels.csv"
    path.write_text("name,start,end\nk,1,2\n")
    code, _, err = run_cli(capsys, "import", str(path), "--server", address)
    assert code == 2
    assert "kernels.csv: not a SQLite file, nor JSON" in err
    assert "Nsight Systems SQLite exports" in err and "PyTorch-profiler traces (Chrome-trace JSON" in err


def test_ups_torch_hint_installs_the_torch_extra_into_this_environment() -> None:
    words = shlex.split(torch_hint())
    assert words[:4] == [sys.executable, "-m", "pip", "install"]
    assert words[4] == "torch>=2.1"  # the version of pyproject's torch extra
