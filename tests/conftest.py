"""Fixtures: a real chDB store in a temp folder and the real gRPC server on a loopback port;
`traces`: two synthetic training runs stored through it."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from query.client import Client
from store.store import Store
from tests.helpers import LateServer
from tests.timeline_trace import Trace, make_trace, store_trace
from tracehouse.cli.serve import Server, create_server
from tracehouse.model import DEFAULT_LIMITS, Limits
from tracehouse.v1 import ingest_pb2_grpc

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
T0 = 1_790_000_000_000_000_000  # 2026-09-21T14:13:20Z


@pytest.fixture
def limits() -> Limits:
    return DEFAULT_LIMITS


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded store made and migrated once; each test's store starts as a copy of its folder
    (migrating a new store takes about half a second; tests of the migrations make their own)."""
    folder = tmp_path_factory.mktemp("migrated") / "store"
    Store.open(f"chdb://{folder}", DEFAULT_LIMITS).close()
    return folder


@pytest.fixture
def store(tmp_path: Path, limits: Limits, migrated_store: Path) -> Iterator[Store]:
    shutil.copytree(migrated_store, tmp_path / "store", symlinks=True)  # the engine's links are relative
    opened = Store.open(f"chdb://{tmp_path / 'store'}", limits)
    yield opened
    opened.close()


@pytest.fixture
def server(store: Store, limits: Limits) -> Iterator[Server]:
    running = create_server(store, "127.0.0.1:0", limits)
    yield running
    running.stop(grace=5)


@pytest.fixture
def address(server: Server) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def channel(address: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 512 << 20)]) as opened:
        yield opened


@pytest.fixture
def ingest(channel: grpc.Channel) -> ingest_pb2_grpc.IngestStub:
    return ingest_pb2_grpc.IngestStub(channel)


@pytest.fixture
def client(address: str) -> Iterator[Client]:
    with Client(address, timeout=30) as opened:
        yield opened


def small_limits(**changes: object) -> Limits:
    return dataclasses.replace(DEFAULT_LIMITS, **changes)  # type: ignore[arg-type]


@pytest.fixture
def traces(ingest: ingest_pb2_grpc.IngestStub) -> dict[str, Trace]:
    first = make_trace("r1", seed=1)
    stored = {"r1": first, "r2": make_trace("r2", seed=2, steps=30, t0=first.end + 1_000_000_000)}
    for trace in stored.values():
        store_trace(ingest, trace)
    return stored


@pytest.fixture
def late(store: Store, limits: Limits, server: Server) -> Iterator[LateServer]:
    waiting = LateServer(store, limits)
    yield waiting
    if waiting.server is not None:
        waiting.server.stop(grace=5)
