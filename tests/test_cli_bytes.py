"""What people read can't be garbled or reordered by what was stored: bytes that are not UTF-8 read
escaped in every format, and control and bidi characters are escaped in tables while JSON and CSV
keep the exact text. The CLI against the real server and store."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.helpers import T0, request
from tracehouse.batch import BatchBuilder
from tracehouse.cli.main import main
from tracehouse.v1 import ingest_pb2_grpc

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: what follows it reads backwards
RUN_NAME = f"train{RLO}gnp.exe\u2066x\u2069\x1b[31m"
KERNEL = f"gemm{RLO}evil\u200f\u061c\x85\n"
UNHEX = "SELECT unhex('ff00fe') AS raw, 'a\\\\b' AS text, unhex('5c41') AS slash_a"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return out


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_bytes_that_are_not_utf8_read_escaped(capsys: pytest.CaptureFixture[str], address: str, fmt: str) -> None:
    out = cli(capsys, "query", "sql", "--server", address, "--format", fmt, UNHEX)
    if fmt == "json":
        assert json.loads(out) == [{"raw": "\\xff\\x00\\xfe", "text": "a\\b", "slash_a": "\\A"}]
    elif fmt == "csv":
        assert list(csv.reader(io.StringIO(out))) == [["raw", "text", "slash_a"], ["\\xff\\x00\\xfe", "a\\b", "\\A"]]
    else:
        assert out.splitlines()[1].split() == ["\\xff\\x00\\xfe", "a\\b", "\\A"]


@pytest.fixture
def hostile_names(ingest: ingest_pb2_grpc.IngestStub) -> None:
    batch = BatchBuilder("names/1", run_id="run-rlo", host="host-a")
    batch.add_run("run-rlo", name=RUN_NAME, host="host-a", source="user", start=T0, end=T0 + 10**9)
    batch.add_events("kernel", [T0], [T0 + 1000], KERNEL, gpu=0)
    ingest.Write(request(batch), timeout=30)


def test_tables_escape_control_and_bidi_characters_json_and_csv_keep_them(
    capsys: pytest.CaptureFixture[str], address: str, hostile_names: None
) -> None:
    runs = cli(capsys, "query", "runs", "--server", address)
    assert "train\\u202egnp.exe\\u2066x\\u2069\\x1b[31m" in runs
    kernels = cli(capsys, "query", "kernels", "--server", address, "--run", "run-rlo")
    assert "gemm\\u202eevil\\u200f\\u061c\\x85\\n" in kernels
    events = cli(capsys, "query", "events", "--server", address, "--run", "run-rlo", "--wide")
    assert "gemm\\u202eevil\\u200f\\u061c\\x85\\n" in events
    for table in (runs, kernels, events):
        assert not any(char in table for char in (RLO, "\u2066", "\u200f", "\u061c", "\x1b", "\x85"))
        assert len(table.splitlines()) == 2, "one line a row"
    assert [
        run["name"] for run in json.loads(cli(capsys, "query", "runs", "--server", address, "--format", "json"))
    ] == [RUN_NAME]
    rows = list(csv.DictReader(io.StringIO(cli(capsys, "query", "kernels", "--server", address, "--format", "csv"))))
    assert [row["name"] for row in rows] == [KERNEL]
