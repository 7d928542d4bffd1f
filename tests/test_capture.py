"""Captures on demand through the real server and store, with real training processes (tests/capture_loop.py)
that record with the training API and profile with a recording profiler behind the profiler interface."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pandas as pd
import pytest

from ingest.captures import (
    FINISH_WITHIN_NS,
    LEAD_NS,
    TAKE_WITHIN_NS,
    CaptureRecord,
    Report,
    check_request,
    parse_ranks,
    start_step,
)
from query.client import Client
from store.store import Store
from tests.helpers import request
from tracehouse.batch import BatchBuilder
from tracehouse.channel import ClientSecurity, open_channel
from tracehouse.cli.main import main
from tracehouse.cli.serve import create_server
from tracehouse.model import Limits
from tracehouse.requesterrors import QueryError
from tracehouse.security import ServerSecurity, parse_tokens
from tracehouse.v1 import capture_pb2, capture_pb2_grpc, ingest_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
MS = 1_000_000
S = 1_000_000_000


class Loop:
    """A training process of tests/capture_loop.py, stopped by a file."""

    def __init__(self, address: str, folder: Path, name: str, *extra: str, rank: int | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.stop_file = folder / f"stop-{name}-{rank}"
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        environment.pop("RANK", None)
        if rank is not None:
            environment["RANK"] = str(rank)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.capture_loop", address, name, str(self.stop_file),
             "--spool", str(folder / f"spool-{rank}"), *extra],
            cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.run_id = self.process.stdout.readline().strip()
        assert self.run_id, self.process.stderr.read() if self.process.stderr else ""

    def stop(self) -> None:
        self.stop_file.touch()
        self.process.wait(60)


@pytest.fixture
def loops(address: str, tmp_path: Path) -> Iterator[list[Loop]]:
    started: list[Loop] = []
    yield started
    for loop in started:
        loop.stop_file.touch()
    for loop in started:
        loop.process.wait(60)


def wait_for(condition: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def steps_of(client: Client, run_id: str) -> pd.DataFrame:
    frame = client.events(kinds=["step"], run=run_id)
    frame["n"] = frame["extras"].map(lambda extras: int(extras["step"]))
    frame["s"] = frame["start"].map(lambda t: int(pd.Timestamp(t).value))
    frame["e"] = frame["end"].map(lambda t: int(pd.Timestamp(t).value))
    return frame.set_index("n").sort_index()


def steps_stored(client: Client, run_id: str, at_least: int = 5) -> bool:
    found = client.sql(f"SELECT count() AS n FROM events WHERE run_id = '{run_id}' AND kind = 'step'")
    return int(found["n"][0]) >= at_least


def on_time(outcome: dict[str, Any], first: int, steps: int) -> bool:
    """The outcome holds `steps` steps from the step asked, or from a later one and says why (a machine
    so loaded that the process heard of the request after the step asked had begun)."""
    counted = outcome["last_step"] - outcome["first_step"] + 1 == steps
    late = outcome["first_step"] > first and "had begun before the order arrived" in outcome["reason"]
    return counted and (outcome["first_step"] == first or late)


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, json.loads(out) if out.strip() else None, err


# -- end to end ----------------------------------------------------------------------------------


def test_a_running_loop_asked_for_five_steps_profiles_exactly_those_into_its_run(
    address: str, client: Client, loops: list[Loop], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = Loop(address, tmp_path, "cap-e2e")
    loops.append(loop)
    wait_for(lambda: steps_stored(client, loop.run_id))
    status, asked, err = cli_json(capsys, "capture", "--run", "cap-e2e", "--steps", "5", "--wait", "60",
                                  "--reason", "step time up", "--format", "json", "--server", address)  # fmt: skip
    assert status == 0, err
    assert asked["run_id"] == loop.run_id and asked["state"] == "done" and asked["reason"] == "step time up"
    assert asked["steps"] == 5 and asked["first_step"] > 0
    [outcome] = asked["outcomes"]
    assert outcome["state"] == "imported", outcome
    assert on_time(outcome, asked["first_step"], 5), outcome
    assert outcome["events"] == 1 and outcome["trace_bytes"] > 0 and outcome["rank"] == 0

    loop.stop()
    steps = steps_of(client, loop.run_id)
    [profiled] = client.events(kinds=["cpu_op"], run=loop.run_id).itertuples()
    start, end = int(pd.Timestamp(profiled.start).value), int(pd.Timestamp(profiled.end).value)
    first, last = outcome["first_step"], outcome["last_step"]
    # the profiler ran from inside step `first`'s start to inside step `last + 1`'s: exactly those five steps
    assert steps.loc[first, "s"] <= start < steps.loc[first, "e"]
    assert steps.loc[last, "e"] <= end < steps.loc[last + 1, "e"]
    assert profiled.pid == loop.process.pid and profiled.tid == steps.loc[first, "tid"]

    status = main(["captures", "--run", loop.run_id, "--server", address])
    table = capsys.readouterr().out
    assert status == 0 and asked["request_id"] in table and "imported" in table and f"{first} to {last}" in table
    assert "step time up" in table


def test_every_rank_captures_the_same_steps_and_ranks_choose_which(
    address: str, client: Client, loops: list[Loop], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"ddp-{time.time_ns()}"
    ranks = [Loop(address, tmp_path, "ddp", "--run-id", run_id, rank=rank) for rank in (0, 1)]
    loops.extend(ranks)
    wait_for(lambda: steps_stored(client, run_id, 10))
    status, asked, err = cli_json(capsys, "capture", "--run", run_id, "--steps", "3", "--wait", "60",
                                  "--format", "json", "--server", address)  # fmt: skip
    assert status == 0, err
    outcomes = asked["outcomes"]
    assert sorted(o["rank"] for o in outcomes) == [0, 1] and {o["state"] for o in outcomes} == {"imported"}
    assert all(on_time(o, asked["first_step"], 3) for o in outcomes), outcomes

    status, asked, err = cli_json(capsys, "capture", "--run", run_id, "--steps", "2", "--ranks", "1", "--wait",
                                  "60", "--format", "json", "--server", address)  # fmt: skip
    assert status == 0, err
    assert asked["ranks"] == [1] and [o["rank"] for o in asked["outcomes"]] == [1]
    assert asked["outcomes"][0]["state"] == "imported"


def test_a_process_without_torch_says_so(
    address: str, client: Client, loops: list[Loop], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = Loop(address, tmp_path, "cap-no-torch", "--profiler", "none-installed")
    loops.append(loop)
    wait_for(lambda: steps_stored(client, loop.run_id))
    status, asked, err = cli_json(capsys, "capture", "--run", loop.run_id, "--wait", "60", "--format", "json",
                                  "--server", address)  # fmt: skip
    assert status == 1, err  # waited, and nothing was imported
    [outcome] = asked["outcomes"]
    assert asked["state"] == "done" and outcome["state"] == "failed"
    assert "torch is not installed" in outcome["reason"]
    assert client.events(kinds=["cpu_op"], run=loop.run_id).empty


def test_step_numbers_that_start_over_each_epoch_are_counted_not_waited_for(
    address: str, client: Client, loops: list[Loop], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = Loop(address, tmp_path, "cap-epochs", "--epoch", "20", "--step-ms", "20")  # 0..19, 0..19, ...
    loops.append(loop)
    wait_for(lambda: steps_stored(client, loop.run_id, 30))
    status, asked, err = cli_json(capsys, "capture", "--run", loop.run_id, "--steps", "25", "--wait", "60",
                                  "--format", "json", "--server", address)  # fmt: skip
    assert status == 0, err
    assert asked["first_step"] > 19  # planned from the pace; numbers never get there
    [outcome] = asked["outcomes"]
    assert outcome["state"] == "imported" and "started over" in outcome["reason"]
    # 25 steps counted across an epoch's end: the last number is below the first
    assert (outcome["first_step"] + 24) % 20 == outcome["last_step"]


# -- refusals -------------------------------------------------------------------------------------


def test_refusals_name_the_reason_and_the_server_stays_up(
    address: str,
    client: Client,
    ingest: ingest_pb2_grpc.IngestStub,
    loops: list[Loop],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def refused(*argv: str) -> str:
        try:
            status = main([*argv, "--server", address])
        except SystemExit as exited:  # argparse's refusal
            status = int(str(exited.code))
        out, err = capsys.readouterr()
        assert status == 2 and not out, (out, err)
        return err

    assert "no run 'no-such-run'" in refused("capture", "--run", "no-such-run")
    imported = BatchBuilder("agent-run/begin").add_run(run_id="agent-run", name="nvml", host="h", source="agent",
                                                       start=time.time_ns())  # fmt: skip
    ingest.Write(request(imported), timeout=30)
    assert "not instrumented: it came from agent" in refused("capture", "--run", "agent-run")

    loop = Loop(address, tmp_path, "cap-refusals")
    loops.append(loop)
    wait_for(lambda: steps_stored(client, loop.run_id))
    first = client.capture(loop.run_id, steps=200)
    under_way = refused("capture", "--run", loop.run_id)
    assert (
        f"capture {first['request_id']} of run {loop.run_id!r} is" in under_way and "one capture at a time" in under_way
    )
    assert f"captures --run {loop.run_id} --server {address}" in under_way  # the hint, pasteable
    wait_for(lambda: [o["state"] for o in client.capture_state(first["request_id"], loop.run_id)["outcomes"]]
             == ["capturing"])  # fmt: skip
    time.sleep(0.5)
    loop.stop()
    wait_for(lambda: client.capture_state(first["request_id"], loop.run_id)["state"] == "done")
    [outcome] = client.capture_state(first["request_id"], loop.run_id)["outcomes"]
    # the run ended mid-capture: the steps it had are imported
    assert outcome["state"] == "imported" and 0 < outcome["last_step"] - outcome["first_step"] + 1 < 200
    wait_for(lambda: not client.runs(name_contains="cap-refusals")["end"].isna().any())
    assert "has ended" in refused("capture", "--run", loop.run_id)

    stub = capture_pb2_grpc.CaptureStub(open_channel(address))
    for wrong, field in (
        (capture_pb2.CaptureRequest(run_id="agent-run", steps=3, seconds=2), "steps"),
        (capture_pb2.CaptureRequest(run_id="agent-run", steps=5000), "steps"),
        (capture_pb2.CaptureRequest(run_id="agent-run", seconds=float("nan")), "seconds"),
        (capture_pb2.CaptureRequest(run_id=""), "run_id"),
    ):
        with pytest.raises(grpc.RpcError) as error:
            stub.Request(wrong, timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error.value.details().startswith(field)
    for report, field in (
        (capture_pb2.CaptureReport(request_id=first["request_id"], run_id=loop.run_id, session="x", state="taken"),
         "session"),
        (capture_pb2.CaptureReport(request_id=first["request_id"], run_id=loop.run_id, session="ab.12", state="won"),
         "state"),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as error:
            stub.Report(report, timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error.value.details().startswith(field)
    with pytest.raises(grpc.RpcError) as error:
        stub.Report(capture_pb2.CaptureReport(request_id="cap-nope", run_id=loop.run_id, session="ab.12",
                                              state="taken"), timeout=10)  # fmt: skip
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "--ranks" in refused("capture", "--run", "x", "--ranks", "0,a")
    assert "not allowed with argument" in refused("capture", "--run", "x", "--steps", "2", "--seconds", "1")
    assert client.runs(name_contains="cap-refusals").shape[0] == 1  # the server answers still


def test_tokens_bound_who_may_ask_and_read_tokens_only_list(store: Store, limits: Limits) -> None:
    ci, writer, reader = "ci-token-0123456789abcdefgh", "write-token-0123456789abcdef", "read-token-0123456789abcdef"
    gpu = "gpu-token-0123456789abcdefg"
    tokens = f"write {ci} runs=ci-\nwrite {writer}\nread {reader}\nwrite {gpu} hosts=gpu-*\n"
    server = create_server(store, "127.0.0.1:0", limits, security=ServerSecurity(parse_tokens(tokens)))
    try:
        with open_channel(f"127.0.0.1:{server.port}") as channel:
            stub, ingest = capture_pb2_grpc.CaptureStub(channel), ingest_pb2_grpc.IngestStub(channel)

            def bearer(token: str) -> tuple[tuple[str, str]]:
                return (("authorization", f"Bearer {token}"),)

            for run_id in ("other-run", "ci-run"):
                described = BatchBuilder(f"{run_id}/b").add_run(
                    run_id=run_id, name=run_id, host="h", source="user", start=time.time_ns()
                )
                ingest.Write(request(described), timeout=30, metadata=bearer(writer))
            for run_id in ("other-run", "no-such-run"):  # outside its bounds is as good as not there: no oracle
                with pytest.raises(grpc.RpcError) as error:
                    stub.Request(capture_pb2.CaptureRequest(run_id=run_id), timeout=10, metadata=bearer(ci))
                assert error.value.code() == grpc.StatusCode.NOT_FOUND
                assert error.value.details() == f"run_id: no run {run_id!r} (`tracehouse query runs` lists them)"
            asked = stub.Request(capture_pb2.CaptureRequest(run_id="ci-run", steps=2), timeout=10, metadata=bearer(ci))
            assert asked.state == "asked" and "runs=ci-" in asked.requested_by and ci not in asked.requested_by
            with pytest.raises(grpc.RpcError) as error:
                stub.Request(capture_pb2.CaptureRequest(run_id="ci-run"), timeout=10, metadata=bearer(reader))
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
            listed = stub.List(capture_pb2.CaptureListRequest(run_id="ci-run"), timeout=10, metadata=bearer(reader))
            assert [c.request_id for c in listed.captures] == [asked.request_id]
            # a writer bound to other hosts neither asks, nor hears, nor reports of this host's runs
            with pytest.raises(grpc.RpcError) as error:
                stub.Request(capture_pb2.CaptureRequest(run_id="ci-run"), timeout=10, metadata=bearer(gpu))
            assert error.value.code() == grpc.StatusCode.NOT_FOUND
            polled = capture_pb2.CapturePoll(run_id="ci-run", session="ab.12", rank=0)
            assert not stub.Poll(polled, timeout=10, metadata=bearer(gpu)).orders
            assert [o.request_id for o in stub.Poll(polled, timeout=10, metadata=bearer(ci)).orders] == [
                asked.request_id
            ]
            report = capture_pb2.CaptureReport(request_id=asked.request_id, run_id="ci-run", session="ab.12",
                                               state="taken")  # fmt: skip
            for verb in (stub.Report, stub.State):
                with pytest.raises(grpc.RpcError) as error:
                    verb(report if verb is stub.Report else capture_pb2.CaptureStateRequest(
                        request_id=asked.request_id, run_id="ci-run"), timeout=10, metadata=bearer(gpu))  # fmt: skip
                assert error.value.code() == grpc.StatusCode.NOT_FOUND
            stub.Report(report, timeout=10, metadata=bearer(ci))
            stub.Report(report, timeout=10, metadata=bearer(ci))  # a retry: said once
            state = stub.State(capture_pb2.CaptureStateRequest(request_id=asked.request_id, run_id="ci-run"),
                               timeout=10, metadata=bearer(ci))  # fmt: skip
            assert state.state == "under way" and [o.state for o in state.outcomes] == ["taken"]
            # the process that took it hears no more of it in its writes' answers; another process still does
            for session, waiting in (("ab.12", False), ("cd.34", True)):
                written = BatchBuilder(f"ci-run/{session}/00000001", run_id="ci-run", host="h")
                answer = ingest.Write(request(written.add_events("step", [3], [4], "step")), timeout=30,
                                      metadata=bearer(writer))  # fmt: skip
                assert answer.capture_waiting is waiting, session
            # a writer of this run hears of the request in its write's answer; of another run, not
            for run_id, waiting in (("ci-run", True), ("other-run", False)):
                written = BatchBuilder(f"{run_id}/more", run_id=run_id, host="h").add_events("step", [1], [2], "step")
                answer = ingest.Write(request(written), timeout=30, metadata=bearer(writer))
                assert answer.capture_waiting is waiting
    finally:
        server.stop(1)


def test_with_tokens_the_process_imports_its_capture_with_its_own_token(
    store: Store, limits: Limits, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer, asker = "trainer-token-0123456789abcdef", "asker-token-0123456789abcdefg"
    tokens = f"write {trainer} runs=tok-\nwrite {asker} runs=tok-\nread read-token-0123456789abcdefg\n"
    server = create_server(store, "127.0.0.1:0", limits, security=ServerSecurity(parse_tokens(tokens)))
    address = f"127.0.0.1:{server.port}"
    (tmp_path / "trainer.token").write_text(trainer)
    (tmp_path / "asker.token").write_text(asker)
    loop = Loop(address, tmp_path, "tok-loop", "--run-id", f"tok-{time.time_ns()}", "--token-file",
                str(tmp_path / "trainer.token"))  # fmt: skip
    try:
        with Client(address, security=ClientSecurity("read-token-0123456789abcdefg")) as reader:
            wait_for(lambda: steps_stored(reader, loop.run_id))
        status, asked, err = cli_json(capsys, "capture", "--run", loop.run_id, "--steps", "3", "--wait", "60",
                                      "--format", "json", "--server", address, "--token-file",
                                      str(tmp_path / "asker.token"))  # fmt: skip
        assert status == 0, err
        assert [o["state"] for o in asked["outcomes"]] == ["imported"] and asked["outcomes"][0]["events"] == 1
        assert trainer not in json.dumps(asked) and asker not in json.dumps(asked)
    finally:
        loop.stop()
        server.stop(1)


# -- the rules, without the network -----------------------------------------------------------------


def test_the_start_step_leaves_every_process_time_to_hear_of_it() -> None:
    assert start_step([], 1_000 * S) == (-1, 0)
    base = 1_000 * S
    seen = [(n, base + (n - 30) * 100 * MS, base + (n - 29) * 100 * MS) for n in range(30, 42)]
    now = seen[-1][2] + 200 * MS  # step 41 ended 200 ms ago
    # the step that begins LEAD_NS (3 s) from now at 100 ms a step: 3.2 s after step 41's end
    assert LEAD_NS == 3 * S and start_step(seen, now) == (41 + 1 + 32, 100 * MS)


def test_request_states_follow_the_processes_reports() -> None:
    asked = CaptureRecord("cap-1", "r", "h", 0, "me", "", 5, 3, 0.0, ())
    assert asked.state(1) == "asked" and asked.state(TAKE_WITHIN_NS) == "expired"
    asked.reports.append(Report("a.1", 0, "h", "taken", 10))
    assert asked.state(20) == "under way" and asked.state(FINISH_WITHIN_NS + 10) == "done"
    asked.reports.append(Report("a.1", 0, "h", "imported", 30, 5, 7, 100, 1))
    asked.reports.append(Report("a.1", 0, "h", "capturing", 30))  # arrived late: the final state stands
    assert asked.state(40) == "done" and asked.latest_by_session()["a.1"].state == "imported"
    assert not asked.order_for("a.1", 0, 40) and asked.order_for("b.2", 3, 40)
    assert not CaptureRecord("cap-2", "r", "h", 0, "me", "", 5, 3, 0.0, (1,)).order_for("b.2", 3, 40)


def test_ranks_and_sizes_are_checked() -> None:
    assert parse_ranks("all") == () and parse_ranks("0,3,5-7") == (0, 3, 5, 6, 7)
    for wrong in ("a", "3-1", "1-", "-1"):
        with pytest.raises(ValueError, match="--ranks"):
            parse_ranks(wrong)
    assert check_request(0, 0.0, [3, 1, 3], "").steps == 10
    assert check_request(0, 0.0, [3, 1, 3], "").ranks == (1, 3)
    with pytest.raises(QueryError, match=r"^reason"):
        check_request(2, 0.0, [], "x" * 2000)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (pip install torch)")
def test_the_real_profiler_captures_ten_steps_of_a_cpu_loop(
    address: str, client: Client, loops: list[Loop], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = Loop(address, tmp_path, "cap-torch", "--profiler", "torch")
    loops.append(loop)
    wait_for(lambda: steps_stored(client, loop.run_id))
    status, asked, err = cli_json(capsys, "capture", "--run", loop.run_id, "--steps", "10", "--wait", "120",
                                  "--format", "json", "--server", address)  # fmt: skip
    assert status == 0, err
    [outcome] = asked["outcomes"]
    assert outcome["state"] == "imported", outcome
    first, last = outcome["first_step"], outcome["last_step"]
    assert on_time(outcome, asked["first_step"], 10), outcome
    loop.stop()
    steps = steps_of(client, loop.run_id)
    ops = client.events(kinds=["cpu_op"], run=loop.run_id)
    assert 10 <= len(ops) <= outcome["events"]
    starts = ops["start"].map(lambda t: int(pd.Timestamp(t).value))
    ends = ops["end"].map(lambda t: int(pd.Timestamp(t).value))
    assert starts.min() >= steps.loc[first, "s"] and ends.max() <= steps.loc[last, "e"]
    assert (ops["name"] == "aten::matmul").sum() == 10  # one a step: exactly the ten steps asked
    assert set(ops["pid"]) == {loop.process.pid}


# -- on a rule ------------------------------------------------------------------------------------


def util_samples(host: str, value: float, seconds: float, end_ns: int, run_id: str = "agent-telemetry") -> Any:
    """gpu.util_pct of GPU 0 at 10 Hz for `seconds` up to `end_ns`, as the agent sends it."""
    import numpy as np

    count = int(seconds * 10)
    ts = end_ns - (count - 1 - np.arange(count)) * 100 * MS
    builder = BatchBuilder(f"{run_id}/{host}/{end_ns}/{value}", run_id=run_id, host=host)
    return request(builder.add_samples("gpu.util_pct", ts, np.full(count, value), gpu=0))


@pytest.fixture
def ruled(store: Store, limits: Limits, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A server with two rules: util below 50 for 2 s (fixed), and below 0.8 times run baseline-run's mean."""
    from ingest.capture_rules import parse_rules

    rules = parse_rules(
        """
rules:
  - {name: util-low, metric: gpu.util_pct, below: 50, for: 2s, steps: 3, every: 10m, runs: "cap-rule*"}
  - {name: below-baseline, metric: gpu.util_pct, below: 0.8, baseline: baseline-run, for: 2s, runs: "plain*"}
  - {name: fwd-low, metric: gpu.util_pct, below: 0.8, baseline: baseline-run, phase: forward, for: 2s,
     runs: "phase*"}
""",
        "test",
    )
    server = create_server(store, "127.0.0.1:0", limits, capture_rules=rules)
    yield f"127.0.0.1:{server.port}", server
    server.stop(1)


def test_a_rule_asks_the_runs_of_a_gpu_whose_telemetry_crossed_it_once_per_every(
    ruled: tuple[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    address, server = ruled
    host = socket.gethostname()
    loop = Loop(address, tmp_path, "cap-rule-loop")
    try:
        with Client(address) as client, open_channel(address) as channel:
            ingest = ingest_pb2_grpc.IngestStub(channel)
            wait_for(lambda: steps_stored(client, loop.run_id))
            base = time.time_ns()
            ingest.Write(util_samples(host, 80.0, 3, base), timeout=30)  # above: nothing
            ingest.Write(util_samples(host, 20.0, 0.5, base + S // 2), timeout=30)  # below, not for 2 s: mean 65
            server.rules.drain()
            assert server.rules.fired == 0 and client.capture_list(loop.run_id) == []
            ingest.Write(util_samples(host, 20.0, 3, base + 7 * S // 2), timeout=30)
            server.rules.drain()
            [asked] = client.capture_list(loop.run_id)
            assert asked["requested_by"] == "rule util-low" and asked["steps"] == 3
            assert asked["reason"].startswith(f"rule util-low: gpu.util_pct averaged 20 over 2 s on {host} GPU 0")
            done = wait_for(lambda: (c := client.capture_state(asked["request_id"], loop.run_id))["state"] == "done"
                            and c)  # fmt: skip
            assert [o["state"] for o in done["outcomes"]] == ["imported"]
            ingest.Write(util_samples(host, 10.0, 3, base + 13 * S // 2), timeout=30)  # within `every`
            server.rules.drain()
            assert server.rules.fired == 1 and len(client.capture_list(loop.run_id)) == 1
    finally:
        loop.stop()


def test_a_rule_against_a_baseline_runs_mean(ruled: tuple[str, Any]) -> None:
    address, server = ruled
    now = time.time_ns()
    with Client(address) as client, open_channel(address) as channel:
        ingest = ingest_pb2_grpc.IngestStub(channel)
        ingest.Write(request(BatchBuilder("baseline-run/d").add_run(
            run_id="baseline-run", name="baseline-run", host="base", source="agent", start=now - 60 * S,
            end=now - 10 * S)), timeout=30)  # fmt: skip
        ingest.Write(util_samples("base", 80.0, 20, now - 20 * S, "baseline-run"), timeout=30)
        running = BatchBuilder("plain-run/d").add_run(
            run_id="plain-run", name="plain-run", host="node-9", source="user", start=now - 5 * S
        )
        ingest.Write(request(running), timeout=30)
        ingest.Write(util_samples("node-9", 70.0, 3, now), timeout=30)  # above 0.8 times 80 = 64
        server.rules.drain()
        assert client.capture_list("plain-run") == []
        ingest.Write(util_samples("node-9", 50.0, 3, now + 4 * S), timeout=30)
        server.rules.drain()
        [asked] = client.capture_list("plain-run")
        assert asked["requested_by"] == "rule below-baseline" and asked["state"] == "asked"
        assert "below 64 (0.8 times 80, run 'baseline-run')" in asked["reason"]


def test_a_rule_with_a_phase_compares_the_samples_inside_that_phase(ruled: tuple[str, Any]) -> None:
    import numpy as np

    address, server = ruled
    now = time.time_ns()
    with Client(address) as client, open_channel(address) as channel:
        ingest = ingest_pb2_grpc.IngestStub(channel)
        baseline = BatchBuilder("baseline-run/d", run_id="baseline-run", host="base").add_run(
            run_id="baseline-run", name="baseline-run", host="base", source="agent", start=now - 60 * S,
            end=now - 10 * S,
        )  # fmt: skip
        baseline.add_events("phase", [now - 40 * S], [now - 15 * S], "forward")
        ingest.Write(request(baseline), timeout=30)
        ingest.Write(util_samples("base", 80.0, 20, now - 20 * S, "baseline-run"), timeout=30)  # 80 in forward
        running = BatchBuilder("phase-run/d", run_id="phase-run", host="node-7").add_run(
            run_id="phase-run", name="phase-run", host="node-7", source="user", start=now - 10 * S
        )
        # forward for the first half of each second of the last 3 s: 50 inside it, 90 outside (70 in all)
        starts = [now - 3 * S + k * S for k in range(3)]
        running.add_events("phase", starts, [t + S // 2 for t in starts], "forward")
        ingest.Write(request(running), timeout=30)
        ts = now - 3 * S + np.arange(30) * 100 * MS
        values = np.where((ts - (now - 3 * S)) % S < S // 2, 50.0, 90.0)
        samples = BatchBuilder("node-7/util", run_id="agent-telemetry", host="node-7")
        ingest.Write(request(samples.add_samples("gpu.util_pct", ts, values, gpu=0)), timeout=30)
        server.rules.drain()
        [asked] = client.capture_list("phase-run")
        assert asked["requested_by"] == "rule fwd-low"
        assert "averaged 50 inside phase 'forward' over 2 s on node-7 GPU 0, below 64 (0.8 times 80" in asked["reason"]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("rules: []", "1 to 100"),
        ("{rules: [{name: a, metric: m, below: 1, color: red}]}", "unknown key 'color'"),
        ("{rules: [{name: a, below: 1}]}", "'metric' is required"),
        ("{rules: [{name: a, metric: m}]}", "give one of 'below' and 'above'"),
        ("{rules: [{name: a, metric: m, below: 1, above: 2}]}", "give one of 'below' and 'above'"),
        ("{rules: [{name: a, metric: m, below: x}]}", "'below' must be a number"),
        ("{rules: [{name: a, metric: m, below: 1, for: soon}]}", "'for': 'soon' is not a duration"),
        ("{rules: [{name: a, metric: m, below: 1, steps: 0}]}", "'steps' must be a whole number from 1 to 1000"),
        ("{rules: [{name: a, metric: m, below: 1}, {name: a, metric: n, above: 2}]}", "rule names repeat"),
        ("a: &x [1]\nb: *x", "aliases"),
        ("rules: [", "not YAML"),
    ],
)
def test_rule_files_are_checked_and_the_refusal_names_the_key(text: str, said: str) -> None:
    from ingest.capture_rules import RuleError, parse_rules

    with pytest.raises(RuleError, match=re.escape(said)):
        parse_rules(text, "rules.yaml")


def test_serve_refuses_a_bad_rule_file_before_it_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("{rules: [{name: a, metric: m, below: 1, every: often}]}")
    status = main(["serve", "--store", f"chdb://{tmp_path / 'store'}", "--listen", "127.0.0.1:0",
                   "--capture-rule", str(rules)])  # fmt: skip
    assert status == 2
    assert f"--capture-rule {rules}: rule 1 (a): 'every': 'often' is not a duration" in capsys.readouterr().err


def test_a_rules_capture_is_compared_with_its_baseline_once_imported(
    ruled: tuple[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    address, server = ruled
    host, now = socket.gethostname(), time.time_ns()
    baseline = BatchBuilder("baseline-run/k", run_id="baseline-run", host="base")
    baseline.add_events("step", [now - 50 * S, now - 49 * S], [now - 49 * S, now - 48 * S], "step")
    baseline.add_events("kernel", [now - 50 * S, now - 49 * S], [now - 50 * S + 4 * MS, now - 49 * S + 4 * MS],
                        "gemm", gpu=0, stream=7)  # fmt: skip
    loop = Loop(address, tmp_path, "plain-loop")
    try:
        with Client(address) as client, open_channel(address) as channel:
            ingest = ingest_pb2_grpc.IngestStub(channel)
            ingest.Write(request(BatchBuilder("baseline-run/d").add_run(
                run_id="baseline-run", name="baseline-run", host="base", source="agent", start=now - 60 * S,
                end=now - 10 * S)), timeout=30)  # fmt: skip
            ingest.Write(request(baseline), timeout=30)
            ingest.Write(util_samples("base", 80.0, 20, now - 20 * S, "baseline-run"), timeout=30)
            wait_for(lambda: steps_stored(client, loop.run_id))
            ingest.Write(util_samples(host, 50.0, 3, time.time_ns()), timeout=30)
            server.rules.drain()
            [asked] = client.capture_list(loop.run_id)
            outcome = wait_for(lambda: next((o for o in client.capture_state(asked["request_id"], loop.run_id)
                                             ["outcomes"] if o["comparison"]), None))  # fmt: skip
            assert outcome["state"] == "imported"
            assert outcome["comparison"]["steps_a"] == 2 and outcome["comparison"]["total_ns_a"] == 4 * MS
            assert outcome["comparison"]["summary"].startswith("no GPU kernels in the captured steps")
            assert main(["captures", "--run", loop.run_id, "--server", address]) == 0
            assert "vs baseline" in capsys.readouterr().out
    finally:
        loop.stop()


def test_the_comparison_is_per_step_and_names_what_changed_most() -> None:
    from ingest.capture_rules import compared

    kernels = [{"name": "gemm", "total_ns_a": 40 * MS, "total_ns_b": 30 * MS},
               {"name": "softmax", "total_ns_a": 10 * MS, "total_ns_b": 12 * MS},
               {"name": "new_kernel", "total_ns_a": 0, "total_ns_b": 3 * MS}]  # fmt: skip
    answer = compared(kernels, "good-run", steps_a=10, steps_b=5)  # per step: A 5 ms, B 9 ms
    assert (answer["total_ns_a"], answer["total_ns_b"]) == (5 * MS, 9 * MS)
    assert [k["name"] for k in answer["kernels"]] == ["gemm", "softmax", "new_kernel"]  # 2 ms, 1.4 ms, 0.6 ms
    assert answer["kernels"][0] == {"name": "gemm", "per_step_ns_a": 4 * MS, "per_step_ns_b": 6 * MS,
                                    "delta_ns": 2 * MS}  # fmt: skip
    assert answer["summary"] == ("kernel time per step 9 ms against 5 ms per step of baseline 'good-run' "
                                 "(+80.0 %); most changed: gemm (+2 ms)")  # fmt: skip
    per_run = compared(kernels, "nsys-run", 0, 5)["summary"]
    assert per_run.startswith("kernel time per step 9 ms against 50 ms per run (the baseline has no steps)")
