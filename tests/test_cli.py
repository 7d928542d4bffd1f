"""The `tracehouse` command against a real server."""

from __future__ import annotations

import io
import json
import socket

import pytest

from tests.helpers import MS, T0, request, run_cli, telemetry, trace
from tracehouse.cli.main import main
from tracehouse.v1 import ingest_pb2_grpc


@pytest.fixture
def loaded(ingest: ingest_pb2_grpc.IngestStub) -> None:
    batch = telemetry("cli-1").add_run("run-a", name="resnet", host="host-a", source="user", start=T0)
    ingest.Write(request(batch), timeout=30)
    ingest.Write(request(trace("cli-2")), timeout=30)


def test_series_json_is_one_document_with_exact_times(
    capsys: pytest.CaptureFixture[str], address: str, loaded: None
) -> None:
    code, out, _ = run_cli(
        capsys, "query", "series", "--server", address, "--metric", "gpu.util", "--gpu", "0",
        "--from", "2026-09-21T14:13:20Z", "--to", str(T0 + 5_000 * MS), "--max-points", "5",
        "--format", "json",
    )  # fmt: skip
    assert code == 0
    rows = json.loads(out)
    assert 0 < len(rows) <= 5
    assert rows[0]["bucket_start"] == T0
    assert sum(r["count"] for r in rows) == 50


def test_events_csv_and_table(capsys: pytest.CaptureFixture[str], address: str, loaded: None) -> None:
    code, out, _ = run_cli(capsys, "query", "events", "--server", address, "--kind", "kernel", "--format", "csv")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("run_id,host,kind,start,end,duration_ns")
    assert len(lines) == 11
    assert lines[1].split(",")[3] == str(T0)
    code, out, _ = run_cli(capsys, "query", "events", "--server", address, "--limit", "2")
    assert code == 0 and "2026-09-21 14:13:20.000 UTC" in out and len(out.strip().splitlines()) == 3


def test_runs_devices_metrics_summary(capsys: pytest.CaptureFixture[str], address: str, loaded: None) -> None:
    assert "resnet" in run_cli(capsys, "query", "runs", "--server", address)[1]
    assert run_cli(capsys, "query", "devices", "--server", address)[1].strip() == "(no rows)"
    assert "gpu.power_w" in run_cli(capsys, "query", "metrics", "--server", address, "--run", "run-a")[1]
    code, out, _ = run_cli(capsys, "query", "kernels", "--server", address, "--format", "json")
    assert code == 0 and json.loads(out)[0]["instances"] == 10


def test_sql_from_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, address: str,
                        loaded: None) -> None:  # fmt: skip
    monkeypatch.setattr("sys.stdin", io.StringIO("SELECT count() AS n FROM samples"))
    code, out, _ = run_cli(capsys, "query", "sql", "-", "--server", address, "--format", "json")
    assert code == 0 and json.loads(out) == [{"n": 400}]


def test_refusals_exit_2_with_the_servers_reason(capsys: pytest.CaptureFixture[str], address: str) -> None:
    code, _, err = run_cli(capsys, "query", "sql", "DROP TABLE samples", "--server", address)
    assert code == 2 and "PERMISSION_DENIED" in err and "read-only" in err
    code, _, err = run_cli(capsys, "query", "series", "--metric", "m", "--run", "nope", "--server", address)
    assert code == 2 and "NOT_FOUND" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["query", "series", "--metric", "m", "--from", "yesterday-ish"], "not a time"),
        (["query", "series", "--metric", "m", "--max-points", "0"], "must be above 0"),
        (["query", "series", "--metric", "m", "--gpu", "x"], "not a GPU index"),
        (["query", "events", "--kind", "kernal"], "invalid choice"),
        (["query", "series"], "--metric"),
        (["query", "runs", "--format", "xml"], "invalid choice"),
    ],
)
def test_bad_options_exit_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_no_server_exits_1_and_says_what_to_start(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = run_cli(capsys, "query", "runs", "--server", f"127.0.0.1:{port}", "--timeout", "5")
    assert code == 1
    assert "tracehouse serve" in err
