"""`tracehouse query` as people use it, against a real server: tables in human units, names that stay
distinct, hints that work when pasted, a closed pipe that ends quietly, runs named by their names."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from query.client import Client
from query.headline import compare_headline
from tests.conftest import FIXTURES
from tests.helpers import MS, T0, request, run_cli, telemetry, trace
from tracehouse.batch import BatchBuilder
from tracehouse.channel import ClientSecurity
from tracehouse.cli.options import command_name
from tracehouse.cli.up import Up, ui_environment
from tracehouse.config import ENV_COMMAND
from tracehouse.v1 import ingest_pb2_grpc

CLOVERLEAF = FIXTURES / "nsys" / "nsys-2024.5-pipit-cloverleaf-4xa100.sqlite"
RAW = re.compile(r"(nan|<NA>|None|NaT)\b")
LONG_NUMBER = re.compile(r"\b\d{10,}\b")  # \b: a run id's hex digits are a name, not a number
REPO = Path(__file__).resolve().parents[1]


def hinted(line: str) -> list[str]:
    """The arguments of a command a hint prints, less the command itself (whatever command_name() is)."""
    prefix = command_name()
    assert line.startswith(prefix + " "), line
    return shlex.split(line[len(prefix) :])


def readable_table(out: str) -> None:
    assert out.strip() and not RAW.search(out), out
    assert not LONG_NUMBER.search(out), out


@pytest.fixture
def cloverleaf(address: str) -> Iterator[str]:
    if not CLOVERLEAF.exists():
        pytest.skip("the CloverLeaf export is not in the fixtures")
    writer = BatchWriter(address, patience=10)
    try:
        yield import_export(CLOVERLEAF, writer).run_id
    finally:
        writer.close()


def test_kernels_table_reads_in_units_with_distinct_names_and_wide_prints_them_whole(
    capsys: pytest.CaptureFixture[str], address: str, cloverleaf: str, client: Client
) -> None:
    code, out, _ = run_cli(capsys, "query", "kernels", "--run", cloverleaf, "--server", address)
    assert code == 0
    readable_table(out)
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["name", "instances", "total"]
    summary = client.summary("kernels", run=cloverleaf)
    assert len(lines) == 1 + len(summary)
    names = [line[: lines[0].index("instances")].strip() for line in lines[1:]]
    assert len(set(names)) == len(summary), "look-alike kernels share a row label"
    assert " ms " in out and " µs " in out and "%" in out
    code, wide, _ = run_cli(capsys, "query", "kernels", "--run", cloverleaf, "--server", address, "--wide")
    assert code == 0 and all(name in wide for name in summary["name"])
    code, data, _ = run_cli(capsys, "query", "kernels", "--run", cloverleaf, "--server", address, "--format", "json")
    assert [row["total_ns"] for row in json.loads(data)] == summary["total_ns"].tolist()


def test_a_closed_pipe_ends_quietly(address: str, cloverleaf: str) -> None:
    """As under `| head -1`, whatever the pipe's capacity: the reader is gone before the answer is written."""
    command = [sys.executable, "-m", "tracehouse.cli", "query", "events", "--run", cloverleaf, "--server", address]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO) as child:
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()
        err = child.stderr.read().decode()
        child.wait(timeout=60)
    assert err == "" and child.returncode == 128 + signal.SIGPIPE  # as a shell reports a command SIGPIPE ended


@pytest.fixture
def loaded(ingest: ingest_pb2_grpc.IngestStub) -> None:
    batch = telemetry("people-1").add_run("run-a", name="resnet", host="host-a", source="user", start=T0)
    ingest.Write(request(batch), timeout=30)
    ingest.Write(request(trace("people-2")), timeout=30)


def test_times_before_now_are_taken_as_typed(capsys: pytest.CaptureFixture[str], address: str, loaded: None) -> None:
    code, _, err = run_cli(capsys, "query", "series", "--metric", "gpu.util", "--from", "-5m", "--to", "-1m",
                       "--server", address)  # fmt: skip
    assert code == 0, err
    typed = [sys.executable, "-m", "tracehouse.cli", "query", "events", "--from", "-90d", "--server", address]
    done = subprocess.run(typed, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_every_hint_ups_banner_prints_works(
    capsys: pytest.CaptureFixture[str], address: str, loaded: None, tmp_path: Path
) -> None:
    for line in Up.hints(address, ClientSecurity()):
        code, out, err = run_cli(capsys, *hinted(line))
        assert code == 0 and out.strip(), err
    token_file = tmp_path / "ui.token"
    for line in Up.hints(address, ClientSecurity("t", token_file=token_file)):
        assert hinted(line)[-2:] == ["--token-file", str(token_file)]
    assert ui_environment(address, None)[ENV_COMMAND] == command_name()


def test_the_command_named_is_the_one_the_user_can_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "venv" / "bin" / "tracehouse"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert command_name("venv/bin/tracehouse", str(tmp_path)) == "venv/bin/tracehouse"
    assert command_name(str(script), str(tmp_path)) == "venv/bin/tracehouse"
    assert command_name(str(script), str(tmp_path / "elsewhere")) == str(script)
    monkeypatch.setenv("PATH", str(script.parent))
    assert command_name("venv/bin/tracehouse", str(tmp_path)) == "tracehouse"


def _gappy(ingest: ingest_pb2_grpc.IngestStub, gaps_per_gpu: int) -> None:
    """Kernels of 1 ms with idle gaps of 2 ms and more between them, on GPUs 0 and 1."""
    builder = BatchBuilder("gappy", run_id="gappy", host="host-g").add_run("gappy", host="host-g", start=T0)
    for gpu in (0, 1):
        starts = T0 + np.cumsum(np.arange(gaps_per_gpu + 1) * 10_000 + 3 * MS)
        builder.add_events("kernel", starts, starts + MS, "k", gpu=gpu, stream=7)
    ingest.Write(request(builder), timeout=30)


def test_gpu_time_table_shows_the_longest_gaps_and_how_to_list_the_rest(
    capsys: pytest.CaptureFixture[str], address: str, ingest: ingest_pb2_grpc.IngestStub, client: Client
) -> None:
    _gappy(ingest, 30)
    assert client.gpu_time(max_gaps=5, run="gappy")["gaps"].attrs["gap_count"] == 60
    assert client.gpu_time(max_gaps=100, run="gappy")["gaps"].attrs["gap_count"] == 60
    code, out, _ = run_cli(capsys, "query", "gpu-time", "--run", "gappy", "--server", address)
    assert code == 0
    readable_table(out)
    table, note = out.split("# gaps\n")[1].rstrip("\n").rsplit("\n", 1)
    assert len(table.splitlines()) == 1 + 20
    assert note.startswith("… and 40 more idle gaps longer than 1 ms; ") and note.endswith(" lists them")
    again = hinted(note.split("; ", 1)[1].removesuffix(" lists them"))
    assert again[-2:] == ["--max-gaps", "60"]
    code, out, _ = run_cli(capsys, *again)
    assert code == 0 and len(out.split("# gaps\n")[1].strip().splitlines()) == 1 + 60 and "more idle" not in out
    code, data, _ = run_cli(capsys, "query", "gpu-time", "--run", "gappy", "--server", address, "--format", "json")
    assert len(json.loads(data)["gaps"]) == 60


@pytest.fixture
def named(ingest: ingest_pb2_grpc.IngestStub) -> None:
    """run-a named resnet and run-b named tuned (each with 10 kernels), twins run-c and run-d."""
    for number, (run_id, name) in enumerate((("run-a", "resnet"), ("run-b", "tuned"), ("run-c", "twin"),
                                             ("run-d", "twin"))):  # fmt: skip
        start = T0 + number * 10_000 * MS
        batch = trace(f"named-{run_id}", run_id=run_id, t0=start)
        ingest.Write(request(batch.add_run(run_id, name=name, host="host-a", start=start, end=start + 2_000 * MS)),
                     timeout=30)  # fmt: skip


def test_runs_are_found_by_their_names(
    capsys: pytest.CaptureFixture[str], address: str, named: None, client: Client
) -> None:
    by_id = run_cli(capsys, "query", "kernels", "--run", "run-a", "--server", address, "--format", "json")
    assert by_id[0] == 0 and run_cli(capsys, "query", "kernels", "--run", "resnet", "--server", address,
                                 "--format", "json") == by_id  # fmt: skip
    assert client.diff("resnet", "tuned").equals(client.diff("run-a", "run-b"))
    assert client.compare(["tuned", "resnet"])["run_id"].tolist() == ["run-b", "run-a"]
    code, _, err = run_cli(capsys, "query", "kernels", "--run", "twin", "--server", address)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "run-c" in err and "run-d" in err and "run id" in err
    code, _, err = run_cli(capsys, "query", "diff", "twin", "resnet", "--server", address)
    assert code == 2 and "run-c" in err and "run_a" in err
    code, _, err = run_cli(capsys, "query", "kernels", "--run", "res net", "--server", address)
    assert code == 2 and "NOT_FOUND" in err and len(err.strip().splitlines()) == 1
    assert "did you mean 'resnet'?" in err, err
    found = hinted(err.strip().split(": ")[-1])
    assert found == ["query", "runs", "--name", "resnet", "--server", address]
    code, out, _ = run_cli(capsys, *found)
    assert code == 0 and "run-a" in out, "the hint lists the run meant"
    code, _, err = run_cli(capsys, "query", "kernels", "--run", "imagenet", "--server", address)
    assert code == 2 and "did you mean" not in err
    assert hinted(err.strip().split(": ")[-1]) == ["query", "runs", "--name", "imagenet", "--server", address]


def test_diff_takes_two_runs_as_compare_does_and_answers_first(
    capsys: pytest.CaptureFixture[str], address: str, named: None, client: Client
) -> None:
    positional = run_cli(capsys, "query", "diff", "run-a", "run-b", "--server", address, "--format", "json")
    assert positional[0] == 0
    assert positional == run_cli(capsys, "query", "diff", "--run", "run-a", "--run", "run-b", "--server", address,
                             "--format", "json")  # fmt: skip
    sentence = compare_headline(client.compare(["run-a", "run-b"]), client.diff("run-a", "run-b"))
    assert sentence
    for what in ("diff", "compare"):
        code, out, _ = run_cli(capsys, "query", what, "run-a", "run-b", "--server", address)
        assert code == 0 and out.startswith(sentence + "\n\n")
        readable_table(out.split("\n\n", 1)[1])


def test_runs_table_says_how_long_and_on_how_many_gpus(
    capsys: pytest.CaptureFixture[str], address: str, named: None, client: Client
) -> None:
    code, out, _ = run_cli(capsys, "query", "runs", "--server", address)
    assert code == 0
    readable_table(out)
    header = out.splitlines()[0]
    assert "duration" in header and "gpus" in header and "attrs" not in header
    assert out.count("2 s") == 4
    # these runs recorded no GPUs: the table counts them as compare (and the Runs page) does
    compared = client.compare(["run-a", "run-b", "run-c", "run-d"]).set_index("run_id")["gpus"]
    for line in out.splitlines()[1:]:
        assert re.search(rf"\b2 s\s+{compared[line.split()[0]]}\b", line), line


def test_the_nvml_refusal_gives_the_reason_and_each_command_its_own_way_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from agent.daemon import open_backend
    from agent.telemetry.gpu import BackendUnavailable

    try:
        open_backend(None)
    except BackendUnavailable as error:
        assert "--simulate" not in str(error)
    else:
        pytest.skip("NVML works here")
    code, _, err = run_cli(capsys, "agent", "--server", "127.0.0.1:1", "--spool", str(tmp_path), "--duration", "1")
    assert code == 1 and "--simulate N" in err


def test_sql_answers_of_any_type_print_as_json(capsys: pytest.CaptureFixture[str], address: str) -> None:
    sql = ("SELECT toDecimal64(1.5, 3) AS fraction, toDecimal64(2, 3) AS whole, "
           "toUUID('61f0c404-5cb3-11e7-907b-a6006ad3dba0') AS id, toDate('2026-12-01') AS day")  # fmt: skip
    code, out, err = run_cli(capsys, "query", "sql", sql, "--format", "json", "--server", address)
    assert code == 0, err
    assert json.loads(out) == [
        {"fraction": "1.500", "whole": 2, "id": "61f0c404-5cb3-11e7-907b-a6006ad3dba0", "day": "2026-12-01"}
    ]
