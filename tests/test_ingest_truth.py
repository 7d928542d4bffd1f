"""Ingest answers the truth: a refusal for content is INVALID_ARGUMENT naming the field, never a
"retry later"; the same rows sent as other bytes are a duplicate; a store folder that refuses
writes is said so (health, every call, and at start); a server killed mid-write loses and doubles
nothing once the agent retries; times are held to a range in which no summary overflows."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2

from agent.shipping.shipper import Shipper
from agent.shipping.spool import EncodedBatch, Spool
from ingest.validate import validate_batch
from query.client import Client
from store.store import Store
from store.storeerrors import BatchRefused, StoreUnavailable
from tests.helpers import MS, T0, closed_port, counts, request, telemetry
from tests.test_serve import health, serve
from tracehouse.batch import BatchBuilder, encode_request
from tracehouse.channel import encoded_write
from tracehouse.cli.serve import Server, status_for
from tracehouse.model import DEFAULT_LIMITS, MAX_EVENT_NS, MAX_TIME_NS
from tracehouse.v1 import ingest_pb2_grpc

DAY = 86_400 * 10**9


def refused(call: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return call.code(), call.details()


# -- content refusals ------------------------------------------------------------------------


def test_dictionary_with_a_repeated_string_is_invalid_argument_naming_it(
    ingest: ingest_pb2_grpc.IngestStub, store: Store
) -> None:
    batch = telemetry("repeats").build()
    batch.dictionary.append(batch.dictionary[0])  # unused, yet the store's Arrow dictionary refuses it
    with pytest.raises(grpc.RpcError) as caught:
        ingest.Write(request(batch), timeout=30)
    code, details = refused(caught.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith(f"batch.dictionary[{len(batch.dictionary) - 1}]: repeats entry 0"), details
    assert counts(store)["samples"] == counts(store)["ingest_batches"] == 0
    assert not ingest.Write(request(telemetry("after")), timeout=30).duplicate, "the server is unaffected"


def test_rows_the_engine_refuses_are_invalid_argument_naming_the_table_without_paths(store: Store) -> None:
    """Should validation ever let through rows the engine refuses: INVALID_ARGUMENT naming the
    table, never UNAVAILABLE (a writer would retry it for ever), and no paths or versions."""
    good = validate_batch(telemetry("engine-refuses").build(), DEFAULT_LIMITS, T0)
    assert good.samples is not None
    metric = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(good.samples.num_rows, np.int32)), pa.array(["gpu.util", "gpu.util"])
    )
    bad = dataclasses.replace(good, samples=good.samples.set_column(4, "metric", metric))
    with pytest.raises(BatchRefused) as caught:
        store.write(bad, T0)
    code, message = status_for(caught.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("samples: the store refused these rows:") and "duplicate" in message, message
    assert "/" not in message and "version" not in message, message
    assert counts(store)["samples"] == counts(store)["ingest_batches"] == 0


def test_no_store_message_reaches_a_client_with_paths_versions_or_stack() -> None:
    engine = (
        "store chdb:///srv/tracehouse/store: Code: 117. DB::Exception: Arrow dictionary contains duplicate "
        "values: (in file/uri /tmp/tmpvx0yn4nu.raw): While executing File: can't create "
        '["/srv/tracehouse/store/store/951/95144ef1/tmp_insert_202609_2_2_0"] (INCORRECT_DATA) '
        "(version 26.9.2.1).\nStack trace:\n0. DB::Exception::Exception() @ 0x000000000c2b3d7b"
    )
    server = "cannot reach the store http://writer:***@clickhouse.internal:8123/tracehouse: Connection refused"
    for error in (StoreUnavailable(engine), BatchRefused(engine), StoreUnavailable(server)):
        _, message = status_for(error)
        for secret in ("/srv", "/tmp", "tmp_insert", "26.9.2.1", "version", "Stack", "0x", "internal", "writer"):
            assert secret not in message, (secret, message)
    assert status_for(StoreUnavailable(server))[1] == "cannot reach the store: Connection refused"
    assert "Arrow dictionary contains duplicate values" in status_for(BatchRefused(engine))[1]


# -- the same rows as other bytes ---------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


UNKNOWN_FIELD = _varint(1000 << 3) + _varint(1)  # field 1000, varint 1: a field this server does not know


def test_same_rows_as_other_bytes_are_a_duplicate(channel: grpc.Channel, store: Store) -> None:
    write = encoded_write(channel)
    batch = telemetry("other-bytes").build()
    sent = encode_request(batch)
    assert not write(sent, timeout=30).duplicate
    inner = batch.SerializeToString(deterministic=True) + UNKNOWN_FIELD
    with_unknown = bytes([(1 << 3) | 2]) + _varint(len(inner)) + inner + UNKNOWN_FIELD  # in Batch and WriteRequest
    answer = write(with_unknown, timeout=30)
    assert answer.duplicate and answer.samples == 400
    assert counts(store)["samples"] == 400 and counts(store)["ingest_batches"] == 1
    other = telemetry("other-bytes", n=99)  # the same id for other rows is still told apart
    with pytest.raises(grpc.RpcError) as caught:
        write(encode_request(other.build()), timeout=30)
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS


# -- a store folder that refuses writes -----------------------------------------------------------


def _writable(folder: Path) -> bool:
    try:
        (folder / ".probe").touch()
    except OSError:
        return False
    (folder / ".probe").unlink()
    return True


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` and all in it refuse writes: by mode for a user; as root, whom modes do not stop,
    by the immutable attribute (a read-only remount fails while the engine has files open)."""
    if os.geteuid() == 0:
        make, undo = ["chattr", "-R", "+i", str(folder)], ["chattr", "-R", "-i", str(folder)]
    else:
        make, undo = ["chmod", "-R", "a-w", str(folder)], ["chmod", "-R", "u+w", str(folder)]
    subprocess.run(make, capture_output=True, check=False)  # chattr complains of symlinks: checked below
    try:
        if _writable(folder):
            pytest.skip(f"{' '.join(make[:2])} cannot make a folder read-only here")
        yield
    finally:
        subprocess.run(undo, capture_output=True, check=False)


def test_folder_that_becomes_read_only_says_so_in_health_and_every_call(
    tmp_path: Path, ingest: ingest_pb2_grpc.IngestStub, client: Client, server: Server, address: str
) -> None:
    folder = tmp_path / "store"
    assert not ingest.Write(request(telemetry("before")), timeout=30).duplicate
    with read_only(folder):
        with pytest.raises(grpc.RpcError) as caught:
            ingest.Write(request(telemetry("while-read-only")), timeout=30)
        code, details = refused(caught.value)
        assert code == grpc.StatusCode.UNAVAILABLE, details
        assert "the store cannot write to its folder" in details and str(tmp_path) not in details, details
        assert "another tracehouse serve" not in details
        assert health(address) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(Exception, match=r"UNAVAILABLE.*cannot write to its folder"):
            client.runs()
    answer = ingest.Write(request(telemetry("while-read-only")), timeout=60)  # writable again: it recovers
    assert not answer.duplicate and answer.samples == 400
    assert health(address) == health_pb2.HealthCheckResponse.SERVING


def test_serve_on_a_read_only_folder_exits_2_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    with read_only(folder):
        result = subprocess.run(
            [sys.executable, "-m", "tracehouse.cli.main", "serve", "--listen", "127.0.0.1:0"],
            env={**os.environ, "TRACEHOUSE_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2, result.stderr
    naming = [line for line in result.stderr.splitlines() if str(folder) in line]
    assert len(naming) == 1 and naming[0].startswith(f"tracehouse: the store folder {folder} is not writable ("), naming
    assert "another tracehouse serve" not in result.stderr


# -- a server killed in the middle of a write ---------------------------------------------------------


def _agent_batch(samples: int, events: int) -> EncodedBatch:
    """One agent batch of three tables, large enough that the engine takes a while over each."""
    builder = BatchBuilder("agent-host-a-000001", run_id="run-kill", host="host-a")
    ts = T0 + np.arange(samples // 8) * 100 * MS
    for gpu in range(8):
        builder.add_samples("gpu.util", ts, (np.arange(ts.size) + gpu) % 100, gpu=gpu)
    starts = T0 + np.arange(events) * MS
    builder.add_events("kernel", starts, starts + MS // 2, [f"kernel-{i % 5000}" for i in range(events)], gpu=0)
    builder.add_run("run-kill", host="host-a", source="agent", start=T0)
    batch = builder.build()
    return EncodedBatch(batch.batch_id, encode_request(batch), samples)


def _wait_for_part(table: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if table.is_dir() and any(p.name[:1].isdigit() for p in table.iterdir()):
            return
        time.sleep(0.002)
    raise AssertionError(f"no part of {table} was stored")


def test_a_server_killed_mid_write_ends_with_one_copy_once_the_agent_retries(tmp_path: Path) -> None:
    """The route taken (docs/reference/data-model.md): every writer of tracehouse
    retries a batch until it is acknowledged; a half-written batch is completed when serve starts
    again, and its retry stores nothing twice."""
    listen = closed_port()
    batch = _agent_batch(samples=400_000, events=300_000)
    stored: list[str] = []
    spool = Spool(tmp_path / "spool", 1 << 30, on_drop=lambda *_: None)
    with serve(home=tmp_path, listen=listen) as (process, address, _):
        shipper = Shipper(address, spool, lambda b, _: stored.append(b), lambda *_: None, call_timeout=120)
        shipper.submit(batch)
        _wait_for_part(tmp_path / "store" / "data" / "tracehouse" / "samples")
        process.send_signal(signal.SIGKILL)  # samples stored, events being stored, no ledger entry yet
        process.wait(timeout=30)
        shipper.shutdown(timeout=1)  # the agent stops too: the batch waits in its spool
    assert not stored and spool.batches == 1
    with serve(home=tmp_path, listen=listen) as (_, address, lines):
        # the group the kill left half-stored is finished from ingest_pending before serve takes a call
        assert any("finished 1 group commits left unfinished" in line for line in lines), "".join(lines)
        with Client(address) as client:
            whole = client.sql("SELECT (SELECT count() FROM samples) AS s, (SELECT count() FROM ingest_batches) AS b")
            assert [int(whole["s"][0]), int(whole["b"][0])] == [400_000, 1], whole
        retried = threading.Event()
        shipper = Shipper(address, spool, lambda b, _: (stored.append(b), retried.set()), lambda *_: None)
        assert retried.wait(timeout=120), "the agent ships its spool when the server is back"
        shipper.shutdown(timeout=5)
        with Client(address) as client:
            after = client.sql(
                "SELECT (SELECT count() FROM samples) AS s, (SELECT count() FROM events) AS e, "
                "(SELECT sum(count) FROM samples_10s) AS rollup, (SELECT count() FROM ingest_batches) AS b"
            )
    assert stored == [batch.batch_id]
    assert [int(after[c][0]) for c in ("s", "e", "rollup", "b")] == [400_000, 300_000, 400_000, 1], after


# -- times held to a range; summaries that cannot overflow -----------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "field", "reason"),
    [
        (T0, 2**63 - 1, "events.end[0]", "is after 2200"),
        (T0, T0 + MAX_EVENT_NS + 1, "events.end[0]", "the limit is"),
        (MAX_TIME_NS, MAX_TIME_NS + 1, "events.start[0]", "is after 2200"),
    ],
)
def test_times_out_of_range_are_refused_naming_the_row(
    ingest: ingest_pb2_grpc.IngestStub, store: Store, start: int, end: int, field: str, reason: str
) -> None:
    builder = BatchBuilder("far-out", run_id="run-a", host="host-a")
    builder.add_events("kernel", [start], [end], "gemm", gpu=0)
    with pytest.raises(grpc.RpcError) as caught:
        ingest.Write(request(builder), timeout=30)
    code, details = refused(caught.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}: ") and reason in details
    assert counts(store)["events"] == 0


def test_a_summary_of_events_that_add_up_past_int64_does_not_wrap(
    ingest: ingest_pb2_grpc.IngestStub, client: Client
) -> None:
    longest = 300  # events of the longest duration allowed: together about 9.5e18 ns, past 2**63
    builder = BatchBuilder("long-kernels", run_id="run-a", host="host-a")
    starts = T0 + np.arange(longest)
    builder.add_events("kernel", starts, starts + MAX_EVENT_NS, "forever", gpu=0)
    builder.add_events("kernel", [T0], [T0 + 5], "short", gpu=0)
    ingest.Write(request(builder), timeout=30)
    summary = client.summary("kernels").set_index("name")
    assert summary.loc["forever", "total_ns"] == 2**63 - 1, "at most the largest Int64: never negative"
    assert summary.loc["forever", "avg_ns"] == MAX_EVENT_NS
    assert summary.loc["short", "total_ns"] == 5, "realistic totals stay exact integer ns"
    assert 0 <= summary.loc["short", "time_pct"] < 1e-15 and summary["time_pct"].sum() == pytest.approx(100)


def test_analyses_of_ranges_that_add_up_past_int64_do_not_wrap(
    ingest: ingest_pb2_grpc.IngestStub, client: Client
) -> None:
    longest = 300
    builder = BatchBuilder("long-ranges", run_id="run-a", host="host-a")
    starts = T0 + np.arange(longest)
    builder.add_events("nvtx", starts, starts + MAX_EVENT_NS, "epoch", tid=7)
    builder.add_events("kernel", starts, starts + MAX_EVENT_NS, "forever", gpu=0, tid=7, launch_start=starts)
    ingest.Write(request(builder), timeout=30)
    summary = client.nvtx_gpu(run="run-a")["summary"].set_index("name")
    assert summary.loc["epoch", "range_total_ns"] == 2**63 - 1, "at most the largest Int64: never negative"
    assert summary.loc["epoch", "with_gpu_work"] == longest, "each range launched the kernels after its start"
    assert summary.loc["epoch", "gpu_total_ns"] == 2**63 - 1
