"""What a writer sends cannot skew another run's figures: a writer bound to run ids alone sends no
samples (they are their host's, read for every run on it), and sums past int64 saturate and say so
rather than wrap. Through the real server and a real store."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from query.client import Client
from store.store import Store
from tests.helpers import MS, T0, S, counts, request
from tracehouse.batch import BatchBuilder
from tracehouse.channel import ClientSecurity, open_channel
from tracehouse.cli.main import main
from tracehouse.cli.serve import create_server
from tracehouse.metrics import GPU_UTIL
from tracehouse.model import Limits
from tracehouse.security import ServerSecurity, parse_tokens
from tracehouse.v1 import ingest_pb2_grpc

AGENT = "agent-token-0123456789abcdef"  # hosts host-a
CI = "ci-token-0123456789abcdefgh"  # runs ci-
CI_HOSTED = "ci-hosted-token-0123456789ab"  # runs ci- on hosts host-a
READER = "read-token-0123456789abcdef"
TOKENS = f"write {AGENT} hosts=host-a\nwrite {CI} runs=ci-\nwrite {CI_HOSTED} hosts=host-a runs=ci-\nread {READER}\n"


def utilisation(batch_id: str, run_id: str, value: float, n: int = 50) -> BatchBuilder:
    """GPU 0 of host-a at `value` % every 100 ms from T0, filed under `run_id`."""
    builder = BatchBuilder(batch_id, run_id=run_id, host="host-a")
    return builder.add_samples(GPU_UTIL, T0 + np.arange(n) * 100 * MS, np.full(n, value), gpu=0)


@pytest.fixture
def served(store: Store, limits: Limits) -> Iterator[tuple[ingest_pb2_grpc.IngestStub, Client]]:
    server = create_server(store, "127.0.0.1:0", limits, security=ServerSecurity(parse_tokens(TOKENS)))
    address = f"127.0.0.1:{server.port}"
    with open_channel(address) as channel, Client(address, security=ClientSecurity(READER)) as client:
        yield ingest_pb2_grpc.IngestStub(channel), client
    server.stop(grace=1)


def write(stub: ingest_pb2_grpc.IngestStub, token: str, batch: BatchBuilder) -> None:
    stub.Write(request(batch), timeout=30, metadata=(("authorization", f"Bearer {token}"),))


def test_a_token_bound_to_run_ids_alone_cannot_write_another_runs_telemetry(
    served: tuple[ingest_pb2_grpc.IngestStub, Client], store: Store
) -> None:
    stub, client = served
    own = BatchBuilder("train/run").add_run("train-a", name="train", host="host-a", start=T0, end=T0 + 5 * S)
    write(stub, AGENT, own)
    write(stub, AGENT, utilisation("train/1", "agent.host-a", 10.0))
    before = client.compare(["train-a"]).iloc[0]
    assert before["gpu_util_mean"] == pytest.approx(10.0)
    series_before = client.series(GPU_UTIL, run="train-a")

    ci_run = BatchBuilder("ci/run").add_run("ci-evil", name="ci", host="host-a", start=T0, end=T0 + 5 * S)
    write(stub, CI, ci_run)  # describing its own run is inside its bounds
    with pytest.raises(grpc.RpcError) as caught:
        write(stub, CI, utilisation("ci/1", "ci-evil", 100.0))
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.details().startswith("batch.samples: this token is bound to run ids (ci-) but not to hosts")
    assert "host 'host-a'" in caught.value.details() and CI not in caught.value.details()

    assert client.compare(["train-a"]).iloc[0]["gpu_util_mean"] == pytest.approx(10.0)
    assert client.series(GPU_UTIL, run="train-a").equals(series_before)
    assert counts(store)["samples"] == 50

    write(stub, CI_HOSTED, utilisation("ci/2", "ci-evil", 100.0, n=1))  # a writer trusted with the host may
    assert counts(store)["samples"] == 51


# --- sums past int64 -----------------------------------------------------------------------

DAY = 86_400 * S
YEAR_AGO = T0 - 366 * DAY


def year_long_kernels(stub: ingest_pb2_grpc.IngestStub, run_id: str, count: int) -> None:
    """`count` kernels of 365 days each, side by side on GPU 0 of a run of a year."""
    run = BatchBuilder(f"{run_id}/run").add_run(run_id, name=run_id, host="host-a", start=YEAR_AGO, end=T0)
    stub.Write(request(run), timeout=30)
    starts = np.full(count, YEAR_AGO, dtype=np.int64)
    work = BatchBuilder(f"{run_id}/k", run_id=run_id, host="host-a").add_events(
        "kernel", starts, starts + 365 * DAY, "gemm", gpu=0
    )
    stub.Write(request(work), timeout=30)


def test_sums_past_int64_saturate_and_say_so(
    ingest: ingest_pb2_grpc.IngestStub, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    year_long_kernels(ingest, "years-a", 400)  # 146,000 days of kernels: past 2**63 - 1 ns (106,751 days)
    year_long_kernels(ingest, "years-b", 300)
    assert main(["query", "diff", "years-a", "years-b", "--server", address, "--format", "json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["total_ns_a"] == row["total_ns_b"] == 2**63 - 1 and row["saturated"] is True
    assert row["delta_ns"] == -100 * 365 * DAY and row["delta_pct"] == pytest.approx(-25.0)
    assert (row["instances_a"], row["instances_b"], row["avg_ns_a"]) == (400, 300, 365 * DAY)
    assert main(["query", "compare", "years-a", "years-b", "--server", address]) == 0
    headline = capsys.readouterr().out.splitlines()[0]
    assert "Biggest change: gemm -36,500 d 00 h (-25.0 %). Sums past 106,751 d 23 h are shown at that cap." in headline
    assert main(["query", "kernels", "--run", "years-a", "--server", address]) == 0
    assert "≥ 106,751 d 23 h" in capsys.readouterr().out, "a table says a sum is at its cap"
    with Client(address) as client:
        short = client.launch(366 * DAY, run="years-a")["short_kernels"].to_dict("records")
    assert [(row["short"], row["short_total_ns"]) for row in short] == [(400, 2**63 - 1)]
    assert main(["query", "compare", "years-a", "years-b", "--server", address, "--format", "json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert [(run["kernels"], run["busy_pct"]) for run in figures] == [(400, pytest.approx(365 / 366 * 100))] * 1 + [
        (300, pytest.approx(365 / 366 * 100))
    ]
