"""Traces that name no host (most Kineto traces, old nsys exports), imported with the CLI on this machine:
each is filed under a host key of its own (its run id), so that its GPUs never collide with this
machine's nor with another host-less trace's; a run's GPUs are those its work touched, not every GPU
the trace describes (deviceProperties lists all of its host's). Real files of ../shared/fixtures,
answers read as printed."""

from __future__ import annotations

import gzip
import json
import re
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.helpers import run_cli

ALEXNET = FIXTURES / "kineto" / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
SIMPLE_ADD = FIXTURES / "kineto" / "critical_path_simple_add_benchmark_result_493459_1694039959_trace.json.gz"
MORDRED = FIXTURES / "nsys" / "nsys-2021.2-mordred-report1-v2.sqlite"
CLOVERLEAF = FIXTURES / "nsys" / "nsys-2024.5-pipit-cloverleaf-4xa100.sqlite"
FILES = (ALEXNET, SIMPLE_ADD, MORDRED, CLOVERLEAF)
WORK = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}

pytestmark = pytest.mark.skipif(not all(p.exists() for p in FILES), reason="the fixtures are not all there")


def kineto_gpus(path: Path) -> tuple[set[int], int]:
    """(the GPUs its GPU work ran on, how many GPUs deviceProperties lists), by json.load."""
    with gzip.open(path, "rt", encoding="utf-8") as file:
        trace: dict[str, Any] = json.load(file)
    used = {e["args"].get("device", e["pid"]) for e in trace["traceEvents"] if e.get("cat") in WORK}
    return used, len(trace["deviceProperties"])


def nsys_gpus(path: Path) -> set[int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        kinds = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
                 if t in tables]  # fmt: skip
        return {row[0] for t in kinds for row in db.execute(f"SELECT DISTINCT deviceId FROM {t}")}


@pytest.fixture
def imported(capsys: pytest.CaptureFixture[str], address: str) -> dict[Path, dict[str, Any]]:
    code, out, err = run_cli(capsys, "import", "--server", address, *map(str, FILES))
    assert code == 0, err
    results = [json.loads(line) for line in out.splitlines()]
    return {Path(result["file"]): result for result in results}


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_hostless_traces_are_filed_under_their_own_run_not_this_machine(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[Path, dict[str, Any]]
) -> None:
    here = socket.gethostname()
    for path in (ALEXNET, SIMPLE_ADD, MORDRED):
        assert imported[path]["host"] == imported[path]["run_id"] != here
    assert imported[CLOVERLEAF]["host"] == "nid008553", "a host the trace names stays"
    code, out, err = run_cli(capsys, "query", "devices", "--server", address, "--format", "json")
    assert code == 0, err
    devices = json.loads(out)
    gpu0 = {row["host"]: row["name"] for row in devices if row["gpu"] == 0}
    assert gpu0[imported[MORDRED]["host"]] == "Quadro RTX 6000"
    assert "A100" in gpu0[imported[ALEXNET]["host"]] and "A100" in gpu0[imported[SIMPLE_ADD]["host"]]
    assert here not in {row["host"] for row in devices}
    for row in devices:
        assert row["run_id"] == row["host"] or row["host"] == "nid008553", "a device belongs to its run"
    code, table, _ = run_cli(capsys, "query", "devices", "--server", address)
    assert "Quadro RTX 6000" in table and "A100-PG509-200" in table
    lines = [line for line in table.splitlines() if line.startswith(imported[MORDRED]["host"])]
    assert len(lines) == 1 and "Quadro RTX 6000" in lines[0], "GPU 0 of the nsys export is listed once, as itself"


def test_a_runs_gpus_are_those_its_work_touched(
    capsys: pytest.CaptureFixture[str], address: str, imported: dict[Path, dict[str, Any]]
) -> None:
    used, described = kineto_gpus(ALEXNET)
    assert described == 8 and used == {0}
    clover = nsys_gpus(CLOVERLEAF)
    runs = {path: imported[path]["run_id"] for path in (ALEXNET, CLOVERLEAF, MORDRED)}
    code, out, err = run_cli(capsys, "query", "compare", *runs.values(), "--server", address, "--format", "json")
    assert code == 0, err
    answer = {row["run_id"]: row for row in json.loads(out)}
    assert answer[runs[ALEXNET]]["gpus"] == len(used) and answer[runs[ALEXNET]]["gpu_indices"] == "0"
    assert answer[runs[CLOVERLEAF]]["gpus"] == len(clover)
    assert answer[runs[CLOVERLEAF]]["gpu_indices"] == ",".join(map(str, sorted(clover)))
    assert answer[runs[MORDRED]]["gpus"] == len(nsys_gpus(MORDRED))
    code, table, err = run_cli(capsys, "query", "runs", "--server", address)
    assert code == 0, err
    header = cells(table.splitlines()[0])
    for path, run_id in runs.items():
        (line,) = [cells(line) for line in table.splitlines() if line.startswith(run_id)]
        expected = len(used) if path == ALEXNET else len(clover if path == CLOVERLEAF else nsys_gpus(MORDRED))
        assert line[header.index("gpus")] == str(expected), line
    code, out, _ = run_cli(capsys, "query", "devices", "--server", address, "--format", "json")
    described_clover = [row for row in json.loads(out) if row["host"] == "nid008553"]
    assert len(described_clover) == 4, "the devices the export describes stay listed"


def test_a_traces_count_is_of_the_gpus_it_touched_and_its_work_picks_them() -> None:
    """Pure: query/rungpus.py as compare and the Runs page use it."""
    from query.rungpus import candidates, recorded_count, run_gpus

    described = tuple(range(8))
    assert recorded_count("kineto", {"gpus": "1", "gpus_described": "8"}, described) == 1
    assert recorded_count("nsys", {"gpus": "0", "gpus_described": "1"}, (0,)) == 0
    assert recorded_count("agent", {"gpus": "2"}, ()) == 2
    for count in (None, 1):
        assert run_gpus(count, candidates("kineto", {}, described, (0,))) == (0,)
    assert run_gpus(None, candidates("user", {"gpus": "1,2"}, (), (0,))) == (1, 2)
