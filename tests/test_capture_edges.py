"""The Capture service at its edges, through the real server and store: every number a request carries
is checked against what its column (or its meaning) holds, the readers take any stored value, asking
is paced per token and run, and a rule file is read like any file named from outside."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ingest.capture_service import _row
from store.store import Store
from tests.helpers import request
from tracehouse.batch import BatchBuilder
from tracehouse.cli.main import main
from tracehouse.pushback import PUSHBACK_KEY
from tracehouse.v1 import capture_pb2, capture_pb2_grpc, ingest_pb2_grpc

PAST_INT64 = 2**63
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def captures(channel: grpc.Channel) -> capture_pb2_grpc.CaptureStub:
    return capture_pb2_grpc.CaptureStub(channel)


def refusal(call: Any, message: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as error:
        call(message, timeout=10)
    return error.value


def report(**fields: Any) -> capture_pb2.CaptureReport:
    return capture_pb2.CaptureReport(
        **{"request_id": "cap-1", "run_id": "run-1", "session": "ab.12", "state": "imported", **fields}
    )


# -- numbers ------------------------------------------------------------------------------------


def test_a_report_of_more_trace_bytes_than_int64_holds_is_refused_naming_the_field(
    captures: capture_pb2_grpc.CaptureStub,
) -> None:
    refused = refusal(captures.Report, report(trace_bytes=PAST_INT64))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == f"trace_bytes: {PAST_INT64} is out of range: 0 to {PAST_INT64 - 1}"


@pytest.mark.parametrize(
    ("method", "message", "said"),
    [
        ("Report", report(events=PAST_INT64), f"events: {PAST_INT64} is out of range: 0 to {PAST_INT64 - 1}"),
        ("Report", report(events=2**64 - 1), "events: 18446744073709551615 is out of range"),
        ("Report", report(rank=-1), "rank: -1 is out of range: 0 to 2147483647"),
        ("Report", report(first_step=-2), "first_step: -2 is out of range: -1 to"),
        ("Report", report(last_step=-(2**63)), f"last_step: {-(2**63)} is out of range: -1 to"),
        ("Poll", capture_pb2.CapturePoll(run_id="run-1", session="ab.12", rank=-5), "rank: -5 is out of range"),
        ("Poll", capture_pb2.CapturePoll(run_id="run-1", session="ab.12", step=-2), "step: -2 is out of range"),
        ("Poll", capture_pb2.CapturePoll(run_id="run-1", session="nope"), "session: 'nope' is not a session"),
        ("Request", capture_pb2.CaptureRequest(run_id="run-1", ranks=[0, 2**31]), "ranks[1]: 2147483648 is out of"),
        ("Request", capture_pb2.CaptureRequest(run_id="run-1", steps=2**32 - 1), "steps: 4294967295 steps; at most"),
        ("Request", capture_pb2.CaptureRequest(run_id="run-1", seconds=float("inf")), "seconds: inf: from 0 to"),
        ("List", capture_pb2.CaptureListRequest(limit=2**32 - 1), "limit: 4294967295; at most 10000"),
        ("Report", report(host="node\x1b[2J-7"), "host: 'node\\x1b[2J-7' holds control characters"),
        ("Report", report(host="node\n7"), "host: 'node\\n7' holds control characters"),
        ("Report", report(host="n" * 257), "host: 257 bytes; at most 256"),
    ],
)
def test_every_number_and_name_a_capture_call_carries_is_checked(
    captures: capture_pb2_grpc.CaptureStub, method: str, message: Any, said: str
) -> None:
    refused = refusal(getattr(captures, method), message)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and refused.details().startswith(said), refused.details()


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda host: BatchBuilder("b1", run_id="r", host=host).add_events("step", [1], [2], "step"), "events.host"),
        (lambda host: BatchBuilder("b1").add_run("r", host=host, source="user", start=1), "runs[0].host"),
        (lambda host: BatchBuilder("b1").add_device(host, 0), "devices[0].host"),
    ],
)
def test_a_batch_host_name_with_control_characters_is_refused_as_a_reports(
    ingest: ingest_pb2_grpc.IngestStub, build: Any, field: str
) -> None:
    refused = refusal(ingest.Write, request(build("node\x1b[31m-7")))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == f"{field}: 'node\\x1b[31m-7' holds control characters"


def store_old_record(store: Store, run_id: str) -> None:
    """A request and a report as a server before these checks kept them: sizes past int64."""
    now = time.time_ns()
    store.append("captures", _row(request_id="cap-old", run_id=run_id, record="request", at=now, steps=10))
    store.append("captures", _row(
        request_id="cap-old", run_id=run_id, record="report", at=now + 1, session="ab.12", state="imported",
        host="node-1", first_step=5, last_step=14, trace_bytes=PAST_INT64, events=2**64 - 1,
    ))  # fmt: skip


def test_captures_prints_a_stored_size_past_int64_in_every_format(
    store: Store, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store_old_record(store, "old-run")
    outputs = {}
    for form in ("table", "csv", "json"):
        assert main(["captures", "--server", address, "--format", form]) == 0
        outputs[form], err = capsys.readouterr()
        assert not err
    [listed] = json.loads(outputs["json"])
    assert listed["outcomes"][0]["trace_bytes"] == PAST_INT64 and listed["outcomes"][0]["events"] == 2**64 - 1
    assert f",{PAST_INT64},{2**64 - 1}," in outputs["csv"]
    assert "cap-old" in outputs["table"] and "8 EiB" in outputs["table"]


def test_the_timeline_capture_panel_shows_a_stored_size_past_int64(
    store: Store, address: str, ingest: ingest_pb2_grpc.IngestStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_ui import open_app, shown

    start = time.time_ns()
    described = BatchBuilder("old-run/b", run_id="old-run", host="node-1")
    described.add_events("step", [start], [start + 10], "step")
    described.add_run(run_id="old-run", name="old", host="node-1", source="user", start=start)
    ingest.Write(request(described), timeout=30)
    store_old_record(store, "old-run")
    app = open_app(address, monkeypatch, "timeline", run="old-run")
    [table] = app.dataframe
    row = shown(table).iloc[0]
    assert row["outcome"] == "imported" and row["steps"] == "5 to 14" and row["trace"] == "8 EiB", dict(row)


# -- rule files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{rules: [{name: a, metric: m, below: 1, phase: fwd}]}", "rule 1 (a): 'phase' needs a 'baseline'"),
        (
            "rules:\n  - name: a\n    metric: m\n    below: 1\n    below: 2\n",
            "line 5: key 'below' repeats (first on line 4)",
        ),
        ("rules: []\nrules: [{name: a}]\n", "line 2: key 'rules' repeats (first on line 1)"),
        (
            "rules:\n  - name: a\n    metric: m\n    below: " + "9" * 5000,
            "rule 1 (a): 'below': a number of 5000 characters",
        ),
        (
            "{rules: [{name: a, metric: m, below: 1, steps: " + "1" * 5000 + "}]}",
            "rule 1 (a): 'steps': a number of 5000",
        ),
        ("{rules: [{name: a, metric: m, above: .inf}]}", "rule 1 (a): 'above' must be a number (a finite one)"),
        ("rules: " + "[" * 10_000, "not YAML: "),
    ],
)
def test_a_rule_file_is_refused_naming_the_file_the_rule_and_the_key(tmp_path: Path, text: str, said: str) -> None:
    from ingest.capture_rules import RuleError, load_rules

    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    with pytest.raises(RuleError) as refused:
        load_rules(rules)
    message = str(refused.value)
    assert message.startswith(f"--capture-rule {rules}: {said}") and "\n" not in message, message


def test_a_rule_file_too_large_is_refused_by_its_size_before_it_is_read(tmp_path: Path) -> None:
    from ingest.capture_rules import RuleError, load_rules

    rules = tmp_path / "rules.yaml"
    with rules.open("wb") as file:
        file.truncate(34_000_000)  # sparse: nothing to read is written
    with pytest.raises(RuleError, match=r"34,000,000 bytes, more than the 262,144 allowed"):
        load_rules(rules)


@pytest.mark.parametrize(
    ("option", "what"),
    [
        ("--capture-rule", "fifo"),
        ("--capture-rule", "/dev/zero"),
        ("--tokens", "fifo"),
        ("--tls-cert", "fifo"),
        ("--store-password-file", "fifo"),
    ],
)
def test_serve_refuses_a_fifo_or_a_device_for_a_file_option_at_once(tmp_path: Path, option: str, what: str) -> None:
    named = tmp_path / "fifo"
    os.mkfifo(named)
    path = named if what == "fifo" else Path(what)
    extra = ["--tls-key", str(named)] if option == "--tls-cert" else []
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tracehouse.cli", "serve", "--store", f"chdb://{tmp_path / 'store'}", "--listen",
         "127.0.0.1:0", option, str(path), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    kind = "a FIFO" if what == "fifo" else "a character device"
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    said = done.stderr  # one line, no traceback
    assert said.startswith(f"tracehouse: {option} {path}: ") and said.endswith(f"not a regular file ({kind})\n"), said
    assert said.count("\n") == 1
    assert time.monotonic() - started < 20


# -- pace ---------------------------------------------------------------------------------------

ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdefgh"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def paced(store: Store) -> Iterator[tuple[str, Clock]]:
    """The Capture service on loopback with tokens for two callers, 2 requests at once then 6 a minute
    per caller and run, on a clock the test moves."""
    from concurrent.futures import ThreadPoolExecutor

    from ingest.capture_service import CaptureBoard, CaptureService
    from ingest.pace import Pace
    from tracehouse.cli.serve import CAPTURE, add_service
    from tracehouse.security import TokenInterceptor, parse_tokens

    clock = Clock()
    server = grpc.server(
        ThreadPoolExecutor(4), interceptors=[TokenInterceptor(parse_tokens(f"write {ALICE}\nwrite {BOB}"))]
    )
    add_service(server, CAPTURE, CaptureService(store, CaptureBoard(store), Pace(2, 6, clock)), 1 << 20)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", clock
    server.stop(1)


def ask(address: str, token: str, run_id: str) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as error:
        capture_pb2_grpc.CaptureStub(channel).Request(
            capture_pb2.CaptureRequest(run_id=run_id), timeout=10, metadata=(("authorization", f"Bearer {token}"),)
        )
    return error.value


def test_capture_requests_are_paced_per_token_and_run(paced: tuple[str, Clock]) -> None:
    address, clock = paced
    for _ in range(2):  # the burst: no such run, but asked
        assert ask(address, ALICE, "run-1").code() == grpc.StatusCode.NOT_FOUND
    refused = ask(address, ALICE, "run-1")
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.details() == (
        "capture requests of run 'run-1': 2 at once, then 6 a minute from one caller; try again in 10 s"
    )
    assert dict(refused.trailing_metadata())[PUSHBACK_KEY] == "10000"
    assert ask(address, ALICE, "run-2").code() == grpc.StatusCode.NOT_FOUND  # another run
    assert ask(address, BOB, "run-1").code() == grpc.StatusCode.NOT_FOUND  # another caller
    clock.now += 4
    assert dict(ask(address, ALICE, "run-1").trailing_metadata())[PUSHBACK_KEY] == "6000"
    clock.now += 6
    assert ask(address, ALICE, "run-1").code() == grpc.StatusCode.NOT_FOUND  # waited: asked again
    assert ask(address, ALICE, "run-1").code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_without_tokens_every_caller_is_one_and_the_cli_says_when_to_try_again(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import small_limits
    from tracehouse.cli.serve import create_server

    server = create_server(store, "127.0.0.1:0", small_limits(capture_burst=1, capture_per_minute=0.5))
    address = f"127.0.0.1:{server.port}"
    try:
        assert main(["capture", "--run", "run-1", "--server", address]) == 2  # no such run
        assert "no run 'run-1'" in capsys.readouterr().err
        assert main(["capture", "--run", "run-1", "--server", address]) == 1  # another connection, one caller
        assert capsys.readouterr().err == (
            "tracehouse: capture requests of run 'run-1': 1 at once, then 0.5 a minute from one caller; "
            "try again in 120 s\n"
        )
    finally:
        server.stop(1)


def test_the_board_reads_only_what_is_new_and_the_whole_window_now_and_then(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest import capture_service
    from ingest.capture_service import CaptureBoard

    board = CaptureBoard(store)
    store.append("captures", _row(request_id="cap-a", run_id="run-1", record="request", at=time.time_ns(), steps=10))
    board.refresh()
    assert board.open_request("run-1") is not None
    back: list[int] = []  # how far back each refresh read
    query = store.query

    def reading(sql: str, parameters: dict[str, Any]) -> Any:
        back.append(time.time_ns() - parameters["since"])
        return query(sql, parameters)

    def states() -> list[str]:
        known = board.get("cap-a")
        assert known is not None
        return [report.state for report in known.reports]

    monkeypatch.setattr(store, "query", reading)
    store.append("captures", _row(request_id="cap-a", run_id="run-1", record="report", at=time.time_ns(),
                                  session="ab.12", state="taken", host="h"))  # fmt: skip
    board.refresh()
    board.refresh()
    assert states() == ["taken"]  # read twice, kept once
    assert max(back) < 90 * 10**9  # a little more than the last second, not two hours
    board._full_at -= capture_service.FULL_EVERY_S
    board.refresh()
    assert back[-1] >= 2 * 3600 * 10**9 and states() == ["taken"]


# -- the Query service's numbers -----------------------------------------------------------------


def test_query_requests_at_the_ends_of_their_numbers_are_answered_or_refused_naming_the_field(
    channel: grpc.Channel, traces: dict[str, Any]
) -> None:
    from tracehouse.v1 import query_pb2, query_pb2_grpc

    most, window = 2**63 - 1, query_pb2.Window
    group_a, group_b = query_pb2.RunGroup(run_ids=["r1"]), query_pb2.RunGroup(run_ids=["r2"])
    cases = [
        ("Events", query_pb2.EventsRequest(window=window(from_ns=most - 1, to_ns=most)), ""),
        ("Events", query_pb2.EventsRequest(window=window(run_id="r1", to_ns=most), page_size=100_000), ""),
        ("Events", query_pb2.EventsRequest(window=window(from_ns=-1)), "window.from_ns"),
        ("Events", query_pb2.EventsRequest(page_size=2**32 - 1), "page_size"),
        ("Series", query_pb2.SeriesRequest(metrics=["gpu.util"], window=window(from_ns=0, to_ns=most)), ""),
        ("Series", query_pb2.SeriesRequest(metrics=["gpu.util"], max_points=1, window=window(to_ns=most)), ""),
        ("Series", query_pb2.SeriesRequest(metrics=["gpu.util"], max_points=2**32 - 1), "max_points"),
        ("Lanes", query_pb2.LanesRequest(window=window(from_ns=0, to_ns=most), buckets=100_000), ""),
        ("Lanes", query_pb2.LanesRequest(buckets=2**32 - 1), "buckets"),
        ("ListMetrics", query_pb2.ListMetricsRequest(window=window(from_ns=most - 1)), ""),
        ("Summary", query_pb2.SummaryRequest(kind="kernels", limit=2**32 - 1, window=window(to_ns=most)), ""),
        ("GpuTime", query_pb2.GpuTimeRequest(window=window(run_id="r1"), min_gap_ns=most, max_gaps=100_000), ""),
        ("GpuTime", query_pb2.GpuTimeRequest(window=window(run_id="r1"), min_gap_ns=-(2**63)), "min_gap_ns"),
        ("Launch", query_pb2.LaunchRequest(window=window(run_id="r1"), short_ns=most), ""),
        ("Launch", query_pb2.LaunchRequest(window=window(run_id="r1"), short_ns=-1), "short_ns"),
        ("NvtxGpu", query_pb2.NvtxGpuRequest(window=window(from_ns=0, to_ns=most), limit=100_000), ""),
        ("Diff", query_pb2.DiffRequest(run_a="r1", run_b="r2", limit=2**32 - 1), ""),
        ("Compare", query_pb2.CompareRequest(run_ids=["r1"], top_kernels=2**32 - 1), "top_kernels"),
        ("Verdict", query_pb2.VerdictRequest(a=group_a, b=group_b, window_ns=most, skip=2**32 - 1), ""),
        ("Verdict", query_pb2.VerdictRequest(a=group_a, b=group_b, window_ns=-(2**63)), "window_ns"),
        ("Verdict", query_pb2.VerdictRequest(a=group_a, b=group_b, min_effect=float("nan")), "min_effect"),
        ("Sql", query_pb2.SqlRequest(sql="SELECT 1 AS one", max_rows=2**32 - 1), ""),
        ("ListRuns", query_pb2.ListRunsRequest(limit=2**32 - 1), "limit"),
    ]
    stub = query_pb2_grpc.QueryStub(channel)
    for method, message, field in cases:
        try:
            getattr(stub, method)(message, timeout=60)
            said = ""
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, message, error.details())
            said = error.details().split(":")[0]
        assert said == field, (method, message)
