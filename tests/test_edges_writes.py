"""A writer bound to run ids cannot skew another run's telemetry: samples are their host's, read
for every run on it, so only a writer bound to hosts may send them. Through the real server with
tokens and a real store."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from ingest.store import Store
from query.client import Client
from tests.helpers import MS, T0, S, counts, request
from tracehouse.batch import BatchBuilder
from tracehouse.channel import ClientSecurity, open_channel
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
