"""Batches for tests, and a way to look at what the store holds."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

from store.store import Store
from tracehouse.batch import BatchBuilder
from tracehouse.cli.main import main
from tracehouse.cli.serve import Server, create_server
from tracehouse.model import Limits
from tracehouse.v1 import batch_pb2, ingest_pb2

T0 = 1_790_000_000_000_000_000  # 2026-09-21T14:13:20Z
MS = 1_000_000
S = 1_000_000_000


def telemetry(batch_id: str, run_id: str = "run-a", host: str = "host-a", n: int = 100, t0: int = T0) -> BatchBuilder:
    builder = BatchBuilder(batch_id, run_id=run_id, host=host)
    ts = t0 + np.arange(n) * 100 * MS
    for gpu in (0, 1):
        builder.add_samples("gpu.util", ts, (np.arange(n) + gpu) % 100, gpu=gpu)
        builder.add_samples("gpu.power_w", ts, np.full(n, 200.0 + gpu), gpu=gpu)
    return builder


def kernels(
    batch_id: str, rows: int, span_ns: int = S, run_id: str = "run-a", host: str = "host-a", t0: int = T0
) -> BatchBuilder:
    """`rows` kernels spread over `span_ns` from `t0`, as an import's chunk holds them."""
    starts = t0 + np.arange(rows, dtype=np.int64) * (span_ns // rows)
    return BatchBuilder(batch_id, run_id=run_id, host=host).add_events("kernel", starts, starts + 1000, "gemm", gpu=0)


def trace(batch_id: str, run_id: str = "run-a", host: str = "host-a", t0: int = T0) -> BatchBuilder:
    builder = BatchBuilder(batch_id, run_id=run_id, host=host)
    starts = t0 + np.arange(10) * 10 * MS
    builder.add_events(
        "kernel",
        starts,
        starts + np.arange(1, 11) * MS,
        "gemm",
        gpu=0,
        stream=7,
        correlation_id=np.arange(10),
    )
    builder.add_events("memcpy", starts[:3], starts[:3] + 2 * MS, "[CUDA memcpy HtoD]", gpu=0, bytes=1 << 20)
    builder.add_events("nvtx", [t0], [t0 + S], "train_step", tid=42, extras=[{"color": "red"}])
    builder.add_events("nvtx", [t0 + 500 * MS], [t0 + 500 * MS], "checkpoint", tid=42)  # an instant
    return builder


def request(batch: batch_pb2.Batch | BatchBuilder) -> ingest_pb2.WriteRequest:
    if isinstance(batch, BatchBuilder):
        batch = batch.build()
    return ingest_pb2.WriteRequest(batch=batch)


def counts(store: Store) -> dict[str, int]:
    """Rows per table, read straight from the store."""
    out = {}
    for table in ("samples", "events", "runs", "devices", "ingest_batches"):
        out[table] = int(store.query(f"SELECT count() AS n FROM {{db}}.{table}").column("n")[0].as_py())
    return out


def import_refused(
    path: Path,
    reason: str,
    address: str,
    capsys: pytest.CaptureFixture[str],
    nothing_kept: Callable[[], bool],
    then: tuple[Path, Callable[[Path], object]],
) -> None:
    """`tracehouse import PATH` exits 2 with one line naming the file and `reason`, and keeps
    nothing (`nothing_kept`); the server, unaffected, then imports `then` (a path and what
    writes it there: two synthetic steps, 10 kernels)."""
    assert main(["import", "--server", address, str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and reason in err and path.name in err, err
    assert nothing_kept()
    good, write = then
    write(good)
    assert main(["import", "--server", address, str(good)]) == 0, "the server is unaffected"
    assert json.loads(capsys.readouterr().out)["events"]["kernel"] == 10


def closed_port() -> str:
    """An address where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


class LateServer:
    """An address where nothing listens until `start()`: a server that comes back (on the
    test's store, so `client` sees what it stores)."""

    def __init__(self, store: Store, limits: Limits) -> None:
        self.address = closed_port()
        self._store = store
        self._limits = limits
        self.server: Server | None = None

    def start(self) -> None:
        self.server = create_server(self._store, self.address, self._limits)


class Clock:
    """A monotonic clock that moves only when a test sets `now`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_until(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(every)


def signal_another_thread(pid: int, number: int) -> None:
    """Send signal `number` to one of process `pid`'s threads other than its main one (tgkill), as the
    kernel may hand a signal sent to the process; skips where the C library has no tgkill."""
    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None:
        pytest.skip("this C library has no tgkill")
    others = [int(task) for task in os.listdir(f"/proc/{pid}/task") if int(task) != pid]
    assert others, f"process {pid} runs threads besides its main one"
    assert tgkill(pid, others[-1], number) == 0, os.strerror(ctypes.get_errno())


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`tracehouse ARGV...` in this process: its exit status, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def imported_runs(address: str, files: Mapping[str, Path]) -> Iterator[dict[str, str]]:
    """Each file imported through the server at `address`: its run id by the key it is given; skips the
    test where any file is absent (the fixtures of ../shared)."""
    from agent.shipping.writer import BatchWriter
    from agent.traces.importer import import_export

    missing = [path.name for path in files.values() if not path.exists()]
    if missing:
        pytest.skip(f"fixtures absent: {', '.join(missing)}")
    writer = BatchWriter(address, patience=120)  # a busy machine: the store may ask to wait
    try:
        yield {key: import_export(path, writer).run_id for key, path in files.items()}
    finally:
        writer.close()
