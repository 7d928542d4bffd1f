"""`tracehouse serve` as its users run it: a subprocess, stopped by a signal."""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from query.client import Client
from tests.helpers import request, signal_another_thread, telemetry
from tracehouse.v1 import ingest_pb2, ingest_pb2_grpc

LISTENING = re.compile(r"listening on [\d.]+:(\d+)")
LOGGED = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")  # logging's asctime


@contextmanager
def serve(
    *args: str, home: Path, listen: str = "127.0.0.1:0", env: Mapping[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """Start `tracehouse serve` (on a free port by default), with `env` added to the environment;
    yield (process, address, log lines)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tracehouse.cli.main", "serve", "--listen", listen, *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TRACEHOUSE_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert process.stderr is not None
    lines: list[str] = []
    port = None
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = LISTENING.search(line)
        port = found.group(1) if found else None
    assert port, "server did not start:\n" + "".join(lines)
    drain = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    try:
        yield process, f"127.0.0.1:{port}", lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        drain.join(timeout=5)


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status)


def test_sigterm_finishes_writes_in_flight_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rows_per_batch = 4 * 20_000
    template = request(telemetry("flight", n=20_000))
    calls: list[tuple[str, float, float, str]] = []  # batch id, call started, answered (wall clock), "ok" or the code
    # what this tests is the stop: no write is turned away because the store is behind (admission)
    with serve("--ack-target-ms", "600000", home=tmp_path) as (process, address, log):
        assert health(address) == health_pb2.HealthCheckResponse.SERVING
        deadline = time.time() + 60

        def writer(worker: int) -> None:
            """Writes until the stop refuses one: a writer has a call under way when the signal
            comes, but for the moment between two calls."""
            with grpc.insecure_channel(address) as channel:
                stub = ingest_pb2_grpc.IngestStub(channel)
                for number in itertools.count():
                    message = ingest_pb2.WriteRequest()
                    message.CopyFrom(template)
                    message.batch.batch_id = f"flight-{worker}-{number}"
                    started = time.time()
                    if started > deadline:
                        return
                    try:
                        stub.Write(message, timeout=60)
                    except grpc.RpcError as error:
                        calls.append((message.batch.batch_id, started, time.time(), error.code().name))
                        return
                    calls.append((message.batch.batch_id, started, time.time(), "ok"))

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        while sum(call[3] == "ok" for call in calls) < 4:
            time.sleep(0.01)
        # the writers' first calls end together, and their next ones start together: a call just
        # sent is not yet the service's, and the stop refuses it. Half a call later each writer's is.
        took = sorted(answered - started for _, started, answered, outcome in calls if outcome == "ok")
        time.sleep(took[len(took) // 2] / 2)
        signalled = time.time()
        process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=120)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("serve did not stop within 60 s of SIGTERM; the end of its log:\n" + "".join(log[-60:]))
        assert code == 0, "".join(log[-60:])
    # the server logs that it stops just before it refuses new calls and lets those under way finish:
    # a call started before the signal and answered after that line (its time, to the ms, cut) was finished
    stopping = [LOGGED.match(line) for line in log if "stopping: finishing calls in flight" in line]
    assert stopping and stopping[0], "".join(log[-30:])
    stopped_at = datetime.strptime(stopping[0].group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() + 0.001
    acknowledged = [call for call in calls if call[3] == "ok"]
    finished = [call for call in acknowledged if call[1] < signalled and call[2] > stopped_at]
    around = [
        f"{batch_id}: {1000 * (started - signalled):+.1f} .. {1000 * (answered - signalled):+.1f} ms {outcome}"
        for batch_id, started, answered, outcome in calls
        if answered > signalled - 1
    ]
    assert finished, (
        f"no call under way at the signal was finished once the server stopped "
        f"({1000 * (stopped_at - signalled):+.0f} ms); calls around the signal:\n" + "\n".join(around)
    )
    # a call that arrives while the server stops, or one not yet handed to the service, is refused,
    # and a sender retries it
    assert {call[3] for call in calls} <= {"ok", "UNAVAILABLE", "CANCELLED"}, "\n".join(around)
    with serve(home=tmp_path) as (_, address, _), Client(address) as client:
        batches = client.sql("SELECT batch_id, samples FROM ingest_batches")
        samples = int(client.sql("SELECT count() AS n FROM samples")["n"][0])
    assert {call[0] for call in acknowledged} <= set(batches["batch_id"]), "every acknowledged batch is stored"
    assert samples == batches["samples"].sum() == rows_per_batch * len(batches), "no batch is half-stored"


def test_sigterm_that_another_thread_takes_still_stops_the_server(tmp_path: Path) -> None:
    """The kernel hands a process's signal to any of its threads; Python runs the handler in the main
    thread only once it wakes. A SIGTERM sent to one of serve's other threads (gRPC's, the engine's)
    stops it as one sent to the process does (it left an untimed wait asleep: about one stop in ten)."""
    with serve(home=tmp_path) as (process, address, log):
        assert health(address) == health_pb2.HealthCheckResponse.SERVING
        signal_another_thread(process.pid, signal.SIGTERM)
        try:
            assert process.wait(timeout=30) == 0, "".join(log[-30:])
        except subprocess.TimeoutExpired:
            pytest.fail("serve did not stop within 30 s of a SIGTERM taken by another thread")


def test_unreachable_store_answers_unavailable_and_logs_no_secret(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    url = f"http://writer:s3cr3t-pw@127.0.0.1:{closed_port}/tracehouse"
    with serve("--store", url, home=tmp_path) as (process, address, lines):
        assert health(address) == health_pb2.HealthCheckResponse.NOT_SERVING
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as caught:
            ingest_pb2_grpc.IngestStub(channel).Write(request(telemetry("lost")), timeout=60)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "cannot reach the store" in caught.value.details()
        assert "s3cr3t-pw" not in caught.value.details()
        with Client(address) as client, pytest.raises(Exception, match="UNAVAILABLE"):
            client.runs()
        assert process.poll() is None, "the server stays up"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    assert "s3cr3t-pw" not in "".join(lines)


def test_second_server_on_one_embedded_store_says_why(tmp_path: Path) -> None:
    with serve(home=tmp_path):
        second = subprocess.run(
            [sys.executable, "-m", "tracehouse.cli.main", "serve", "--listen", "127.0.0.1:0"],
            env={**os.environ, "TRACEHOUSE_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert second.returncode == 1
    assert "another tracehouse serve" in second.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "tracehouse.cli.main", "serve", "--listen", f"127.0.0.1:{port}"],
            env={**os.environ, "TRACEHOUSE_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_serve_leaves_scipy_to_the_first_verdict() -> None:
    """scipy's statistics take 0.8 s to import, half of what importing `serve` took: they are
    loaded by the first verdict that asks for a quantile, not at every start."""
    found = subprocess.run(
        [sys.executable, "-c", "import sys, tracehouse.cli.serve; print('scipy' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == "False"


def test_writers_are_answered_at_the_claim_unless_told_to_wait_until_stored() -> None:
    from tracehouse.cli.main import build_parser

    parse = build_parser().parse_args
    assert parse(["serve"]).ack_within_ms is None and not parse(["serve"]).ack_once_stored
    assert parse(["serve", "--ack-once-stored"]).ack_once_stored
    with pytest.raises(SystemExit):
        parse(["serve", "--ack-once-stored", "--ack-within-ms", "50"])
