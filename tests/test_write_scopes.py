"""Writers stay in their lane: write tokens bound to hosts and run-id prefixes, and run
descriptions that answer to the stored ones, through the real server with a real store."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from store.store import Store
from tests.helpers import T0, counts, request, telemetry, trace
from tracehouse.batch import BatchBuilder
from tracehouse.channel import open_channel, read_token
from tracehouse.cli.main import main
from tracehouse.cli.serve import Server, create_server
from tracehouse.cli.up import Up
from tracehouse.model import Limits
from tracehouse.security import SecurityError, ServerSecurity, parse_tokens
from tracehouse.v1 import batch_pb2, ingest_pb2, ingest_pb2_grpc

GPU = "gpu-token-0123456789abcdef"  # hosts gpu-* or dgx-?
DGX = "dgx-token-0123456789abcdef"  # hosts dgx-*
CI = "ci-token-0123456789abcdefgh"  # runs ci- or nightly/
WRITER = "write-token-0123456789abcdef"  # unbounded
ADMIN = "admin-token-0123456789abcdef"
READER = "read-token-0123456789abcdef"
TOKENS = f"""# agents, bound to their hosts
write {GPU} hosts=gpu-*,dgx-?
write {DGX} hosts=dgx-*
# a CI import job, bound to its run ids
write {CI} runs=ci-,nightly/
write {WRITER}
admin {ADMIN}
read {READER}
"""
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT


Send = Callable[[str, batch_pb2.Batch | BatchBuilder], ingest_pb2.WriteResponse]


def sender(stub: ingest_pb2_grpc.IngestStub) -> Send:
    """send(token, batch): Write it with that token (none: ""); raises grpc.RpcError when refused."""

    def sent(token: str, batch: batch_pb2.Batch | BatchBuilder) -> ingest_pb2.WriteResponse:
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        response: ingest_pb2.WriteResponse = stub.Write(request(batch), timeout=30, metadata=metadata)
        return response

    return sent


@pytest.fixture
def send(store: Store, limits: Limits) -> Iterator[Send]:
    """Writes to a server with TOKENS, on the test's store."""
    server = create_server(store, "127.0.0.1:0", limits, security=ServerSecurity(parse_tokens(TOKENS)))
    with open_channel(f"127.0.0.1:{server.port}") as channel:
        yield sender(ingest_pb2_grpc.IngestStub(channel))
    server.stop(grace=1)


@pytest.fixture
def send_plain(ingest: ingest_pb2_grpc.IngestStub) -> Send:
    """Writes to a server without tokens (loopback), on the test's store."""
    return sender(ingest)


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def describe(batch_id: str, run_id: str, host: str, name: str = "", importing: bool = False) -> BatchBuilder:
    return BatchBuilder(batch_id).add_run(run_id, name=name or run_id, host=host, start=T0, importing=importing)


def runs(store: Store) -> dict[str, tuple[str, str, bool]]:
    """run id -> (name, host, importing), as the latest descriptions say."""
    table = store.query("SELECT run_id, name, host, importing FROM {db}.runs FINAL").to_pylist()
    return {row["run_id"]: (row["name"], row["host"], row["importing"]) for row in table}


def with_row_hosts(builder: BatchBuilder, table: str, hosts: list[str]) -> batch_pb2.Batch:
    """The batch with a host for each row of `table` (the wire's per-row host column)."""
    batch = builder.build()
    codes = {}
    for host in dict.fromkeys(hosts):
        codes[host] = len(batch.dictionary)
        batch.dictionary.append(host)
    getattr(batch, table).host.extend(codes[host] for host in hosts)
    return batch


# --- the tokens file and `tracehouse token` --------------------------------------------------


def test_tokens_file_lines_carry_bounds() -> None:
    tokens = parse_tokens(TOKENS)
    assert len(tokens) == 6
    gpu, ci, writer = tokens.grant_of(GPU), tokens.grant_of(CI), tokens.grant_of(WRITER)
    assert gpu is not None and ci is not None and writer is not None
    assert (gpu.scopes, gpu.hosts, gpu.runs) == ({"write"}, ("gpu-*", "dgx-?"), None)
    assert (ci.hosts, ci.runs) == (None, ("ci-", "nightly/"))
    assert not writer.bounded and tokens.scopes_of(ADMIN) == {"read", "write"}
    assert gpu.allows_host("gpu-17") and gpu.allows_host("dgx-1") and not gpu.allows_host("dgx-12")
    assert not gpu.allows_host("GPU-1"), "globs match case"
    assert ci.allows_run("nightly/42") and not ci.allows_run("nightly-42")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"read {READER} hosts=gpu-*", "line 2: hosts= and runs= bound what a token writes; a read token reads"),
        (f"write {WRITER} hosts=", "line 2: hosts= needs a list separated by commas"),
        (f"write {WRITER} hosts=gpu-*, dgx-1", "line 2: hosts= needs a list separated by commas"),
        (f"write {WRITER} hosts=a hosts=b", "line 2: hosts= is given twice"),
        (f"write {WRITER} runs=ci-*", "line 2: runs= takes run-id prefixes made of"),
        (f"write {WRITER} gpu-*", "line 2: expected 'SCOPE TOKEN' and then only hosts="),
        (f"write {WRITER} {GPU}", "(word 3 is neither)"),
        (f"write {WRITER} host=gpu-*", "(word 3 is neither)"),
        (f"write hosts=gpu-* {WRITER}", "line 2: the second word must be the token"),
    ],
)
def test_bound_errors_name_the_line_never_the_token(line: str, message: str) -> None:
    with pytest.raises(SecurityError) as caught:
        parse_tokens(f"# one line\n{line}\n", "--tokens t.txt")
    assert str(caught.value).startswith("--tokens t.txt line 2: ") and message in str(caught.value)
    for token in (READER, WRITER, GPU):
        assert token not in str(caught.value)


def test_token_command_prints_a_bound_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--scope", "write", "--hosts", "gpu-*,dgx-?", "--hosts", "a100-1", "--runs", "ci-"]) == 0
    line = capsys.readouterr().out.strip()
    scope, token, *bounds = line.split()
    assert scope == "write" and len(token) >= 40 and bounds == ["hosts=gpu-*,dgx-?,a100-1", "runs=ci-"]
    grant = parse_tokens(line).grant_of(token)
    assert grant is not None and grant.hosts == ("gpu-*", "dgx-?", "a100-1") and grant.runs == ("ci-",)
    assert main(["token", "--scope", "read", "--hosts", "gpu-*"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "a read token reads everything" in err


def test_a_bounded_line_copied_whole_is_a_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--scope", "write", "--hosts", "gpu-*", "--runs", "ci-"]) == 0
    line = capsys.readouterr().out.strip()
    (tmp_path / "token").write_text(line + "\n")
    assert read_token(tmp_path / "token") == line.split()[1]
    (tmp_path / "token").write_text(line.replace(" runs=", " other="))
    with pytest.raises(SecurityError, match="expected one token"):
        read_token(tmp_path / "token")


# --- bounds, through the server -------------------------------------------------------------


def test_writes_inside_the_bounds_are_stored(send: Send, store: Store) -> None:
    agent = trace("gpu-1/1", run_id="agent.gpu-1", host="gpu-1").add_run("agent.gpu-1", host="gpu-1", start=T0)
    send(GPU, agent.add_device("gpu-1", 0, run_id="agent.gpu-1", name="H100"))
    send(GPU, telemetry("dgx-7/1", run_id="agent.dgx-7", host="dgx-7"))
    send(CI, trace("ci/1", run_id="ci-1234", host="any-host").add_run("ci-1234", host="any-host", start=T0))
    send(CI, trace("ci/2", run_id="nightly/7", host="builder"))
    send(WRITER, telemetry("w/1", run_id="anything", host="anywhere"))
    send(ADMIN, describe("a/1", "admin-run", "anywhere"))
    assert counts(store)["ingest_batches"] == 6
    assert set(runs(store)) == {"agent.gpu-1", "ci-1234", "admin-run"}


@pytest.mark.parametrize(
    ("token", "batch", "details"),
    [
        (
            GPU,
            telemetry("b", host="dgx-12"),
            "batch.samples.host[0]: 'dgx-12' is outside this token's hosts (gpu-*, dgx-?)",
        ),
        (
            GPU,
            with_row_hosts(trace("b", host="gpu-1"), "events", ["gpu-1"] * 7 + ["cpu-1"] + ["gpu-1"] * 7),
            "batch.events.host[7]: 'cpu-1' is outside this token's hosts",
        ),
        (GPU, telemetry("b", host="gpu-1").add_run("r", host="cpu-1"), "batch.runs[0].host: 'cpu-1' is outside"),
        (GPU, telemetry("b", host="gpu-1").add_device("gpu-1", 0).add_device("cpu-1", 0), "batch.devices[1].host"),
        (DGX, telemetry("b", host="gpu-1"), "batch.samples.host[0]: 'gpu-1' is outside this token's hosts (dgx-*)"),
        (CI, telemetry("b", run_id="main-1"), "batch.samples.run[0]: 'main-1' is outside this token's run-id prefixes"),
        (CI, trace("b", run_id="ci-1").add_run("main-1"), "batch.runs[0].run_id: 'main-1' is outside"),
        (CI, describe("b", "ci-1", "h").add_device("h", 0), "batch.devices[0].run_id: '' is outside"),
        (GPU, telemetry("b", host="x" * 200), "'" + "x" * 64 + "…' is outside"),
    ],
    ids=["samples", "events-row", "run-host", "device", "other-glob", "run-prefix", "run-id", "device-run", "long"],
)
def test_writes_outside_the_bounds_are_refused_naming_the_field(
    send: Send,
    store: Store,
    token: str,
    batch: BatchBuilder | batch_pb2.Batch,
    details: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        error = refused(lambda: send(token, batch))
    assert error.code() == PERMISSION_DENIED and details in error.details(), error.details()
    assert len(error.details()) < 300 and token not in error.details()
    assert not any(counts(store).values()), "nothing of a refused batch is stored"
    assert not any(token in record.getMessage() for record in caplog.records)
    send(WRITER, telemetry("after"))  # the server goes on


# --- run descriptions -----------------------------------------------------------------------


def test_a_bounded_token_cannot_take_over_another_hosts_run(send: Send, store: Store) -> None:
    send(GPU, describe("gpu-1/run", "train-7", "gpu-1", name="resnet"))
    by_dgx_host = refused(lambda: send(DGX, describe("dgx/1", "train-7", "dgx-1", name="hidden", importing=True)))
    assert by_dgx_host.code() == PERMISSION_DENIED, "the run is on a host outside the token's bounds"
    assert "batch.runs[0].run_id: run 'train-7' belongs to host 'gpu-1', outside this token's hosts (dgx-*)" in (
        by_dgx_host.details()
    )
    as_gpu_host = refused(lambda: send(DGX, describe("dgx/2", "train-7", "gpu-1", name="hidden")))
    assert as_gpu_host.code() == PERMISSION_DENIED and "batch.runs[0].host: 'gpu-1' is outside" in as_gpu_host.details()
    moved = refused(lambda: send(WRITER, describe("w/1", "train-7", "dgx-1")))
    assert moved.code() == INVALID_ARGUMENT
    assert "batch.runs[0].host: run 'train-7' is stored under host 'gpu-1', not 'dgx-1'" in moved.details()
    assert runs(store) == {"train-7": ("resnet", "gpu-1", False)}
    assert counts(store)["ingest_batches"] == 1


def test_a_finished_import_is_never_sent_back_to_importing(send_plain: Send, store: Store) -> None:
    """Whoever asks: here a server without tokens, which lets every call in."""
    send = send_plain
    begin = describe("nsys-1/run/v1/begin", "nsys-1", "gpu-1", name="profile", importing=True)
    send("", begin)
    send("", trace("nsys-1/kernels", run_id="nsys-1", host="gpu-1"))
    assert runs(store)["nsys-1"][2], "hidden while it imports"
    send("", describe("nsys-1/run/v1/end", "nsys-1", "gpu-1", name="profile"))
    assert send("", begin).duplicate, "importing the same file again sends the same batches: stored once"
    error = refused(lambda: send("", describe("hide", "nsys-1", "gpu-1", name="profile", importing=True)))
    assert error.code() == INVALID_ARGUMENT
    assert "batch.runs[0].importing: run 'nsys-1' has finished importing" in error.details()
    in_one_batch = describe("both", "ci-9", "gpu-1").add_run("ci-9", host="gpu-1", importing=True)
    error = refused(lambda: send("", in_one_batch))
    assert error.code() == INVALID_ARGUMENT and "batch.runs[1].importing: run 'ci-9'" in error.details()
    assert runs(store) == {"nsys-1": ("profile", "gpu-1", False)}


def test_who_may_rename_a_run(send: Send, store: Store) -> None:
    """Whoever may write the run (its id and host inside the token's bounds) may rename it."""
    send(GPU, describe("r/1", "ci-train", "gpu-1", name="first"))
    send(GPU, describe("r/2", "ci-train", "gpu-1", name="by its agent"))
    assert runs(store)["ci-train"][0] == "by its agent"
    send(CI, describe("r/3", "ci-train", "gpu-1", name="by CI"))
    assert runs(store)["ci-train"][0] == "by CI"
    send(WRITER, describe("r/4", "ci-train", "gpu-1", name="by an unbounded writer"))
    assert runs(store)["ci-train"][0] == "by an unbounded writer"
    assert refused(lambda: send(DGX, describe("r/5", "ci-train", "gpu-1", name="x"))).code() == PERMISSION_DENIED
    send(GPU, describe("r/6", "main-train", "gpu-2", name="main"))
    error = refused(lambda: send(CI, describe("r/7", "main-train", "gpu-2", name="x")))
    assert error.code() == PERMISSION_DENIED and "batch.runs[0].run_id: 'main-train'" in error.details()
    assert runs(store) == {
        "ci-train": ("by an unbounded writer", "gpu-1", False),
        "main-train": ("main", "gpu-2", False),
    }


def test_concurrent_descriptions_of_one_run_are_checked_one_at_a_time(send_plain: Send, store: Store) -> None:
    hosts = [f"host-{i}" for i in range(6)]
    outcomes: dict[str, grpc.StatusCode] = {}
    start = threading.Barrier(len(hosts))

    def claim(host: str) -> None:
        start.wait()
        try:
            send_plain("", describe(f"claim/{host}", "contested", host))
            outcomes[host] = grpc.StatusCode.OK
        except grpc.RpcError as error:
            outcomes[host] = error.code()

    threads = [threading.Thread(target=claim, args=(host,)) for host in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    winners = [host for host, code in outcomes.items() if code == grpc.StatusCode.OK]
    assert len(winners) == 1 and list(outcomes.values()).count(INVALID_ARGUMENT) == len(hosts) - 1
    assert runs(store) == {"contested": ("contested", winners[0], False)}


# --- tracehouse up ---------------------------------------------------------------------------


def test_up_gives_its_agent_a_token_bound_to_this_host(store: Store, limits: Limits) -> None:
    up = Up(ui_port=None, demo=False)
    security = up.secure(ServerSecurity(parse_tokens(f"read {READER}\n")))
    assert up.agent_token is not None and security.tokens is not None
    server: Server = create_server(store, "127.0.0.1:0", limits, security=security)
    try:
        with open_channel(f"127.0.0.1:{server.port}") as channel:
            stub = ingest_pb2_grpc.IngestStub(channel)
            metadata = (("authorization", f"Bearer {up.agent_token}"),)
            here = socket.gethostname()
            stub.Write(request(telemetry("here", host=here)), timeout=30, metadata=metadata)
            error = refused(lambda: stub.Write(request(telemetry("there", host=f"not-{here}")), metadata=metadata))
        assert error.code() == PERMISSION_DENIED and f"batch.samples.host[0]: 'not-{here}'"[:40] in error.details()
        assert counts(store)["ingest_batches"] == 1
    finally:
        server.stop(grace=1)


def test_one_writers_batch_ids_never_meet_anothers(send: Send, store: Store) -> None:
    """A bounded token that sends another host's next batch id first stores its own batch; the
    other host's batch of that id is still stored, and nothing tells either of the other."""
    squatted = "agent.dgx-1.20260921T141320.000000Z/00000002"
    send(GPU, telemetry(squatted, run_id="gpu-1-run", host="gpu-1", n=1))
    answer = send(DGX, telemetry(squatted, run_id="agent.dgx-1", host="dgx-1", n=50))
    assert not answer.duplicate and answer.samples == 200
    again = send(DGX, telemetry(squatted, run_id="agent.dgx-1", host="dgx-1", n=50))
    assert again.duplicate, "a writer's own retry is still one batch"
    send(DGX, telemetry(squatted[:-1] + "3", run_id="agent.dgx-1", host="dgx-1", n=50))
    probe = send(GPU, telemetry(squatted[:-1] + "3", run_id="gpu-1-run", host="gpu-1", n=2))
    assert probe.samples == 8 and not probe.duplicate, "the probe learns nothing of the other host's batch"
    hosts = store.query("SELECT host, count() AS n FROM {db}.samples GROUP BY host ORDER BY host").to_pylist()
    assert hosts == [{"host": "dgx-1", "n": 400}, {"host": "gpu-1", "n": 12}]


def test_a_bounded_token_cannot_file_rows_under_another_hosts_run(send: Send, store: Store) -> None:
    send(DGX, describe("dgx/run", "train-9", "dgx-10"))
    send(DGX, telemetry("dgx/1", run_id="train-9", host="dgx-10", n=10))
    for batch in (
        telemetry("gpu/1", run_id="train-9", host="gpu-1", n=5),
        trace("gpu/2", run_id="train-9", host="gpu-1"),
        BatchBuilder("gpu/3").add_device("gpu-1", 0, run_id="train-9", name="FAKE"),
    ):
        refusal = refused(lambda batch=batch: send(GPU, batch))
        assert refusal.code() == PERMISSION_DENIED
        assert "run 'train-9' belongs to host 'dgx-10', outside this token's hosts" in refusal.details()
    assert counts(store)["samples"] == 40 and counts(store)["events"] == 0 and counts(store)["devices"] == 0
    send(DGX, telemetry("dgx/2", run_id="train-9", host="dgx-10", n=10))  # its own host still may
    assert counts(store)["samples"] == 80
