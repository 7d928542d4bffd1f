"""The batches of `bench load --writers`: a fleet of agents' telemetry, encoded once by the agent's own
sampler and batcher over simulated GPUs, then made into each writer's distinct batches at almost no cost.

Writer w closes batch k (k = 0, 1, ...) at `due_s(w, k)` seconds after the start: its samples cover the
`interval` before, with writer w's start jittered by up to one interval. Each send is a template patched
twice: its timestamps are shifted in place (SampleColumns.ts is a packed sfixed64 field, a little-endian
int64 array in the encoded bytes), and a second, tiny Batch with the writer's batch id, run and host is
appended (protobuf merges a repeated embedded message, and a later singular field overrides an earlier one).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from agent.shipping.batcher import Batcher
from agent.shipping.spool import EncodedBatch
from agent.shipping.stats import Stats
from agent.telemetry.sampler import Sampler
from agent.telemetry.simulated import SimulatedBackend
from tracehouse.v1 import batch_pb2, ingest_pb2

MS = 1_000_000
TICK_MS = 100  # the agent's 10 Hz
SLOW_TICKS = 10  # and its 1 s slow tick (PCIe, GPM, processes)
START_MS = 1_000_000  # simulated time of the first template: 10 min into a training run
WARM_MS = 600_000


@dataclass(frozen=True)
class Template:
    payload: bytes  # a WriteRequest as the agent encodes it
    ts_offset: int  # where its SampleColumns.ts array starts in `payload`
    rows: int
    origin_ns: int  # the start of the interval its samples cover


class FleetBatches:
    """Every writer's batches, from `templates` intervals of `gpus` simulated GPUs (rotated, so that
    consecutive batches of a writer and batches of neighbouring writers differ)."""

    def __init__(self, writers: int, gpus: int, interval_ms: int, templates: int = 4, seed: int = 17) -> None:
        if interval_ms < TICK_MS:
            raise ValueError(f"--interval: at least {TICK_MS / 1000} s, one tick of the agent")
        self.writers, self.gpus = writers, gpus
        self.interval_ns = interval_ms * MS
        self.templates = encode_templates(gpus, interval_ms, min(templates, writers))
        self.jitter_ns = np.random.default_rng(seed).integers(0, interval_ms, writers) * MS

    def host(self, writer: int) -> str:
        return f"fleet-{writer:04d}"

    def batch_id(self, writer: int, k: int) -> str:
        return f"fleet/{writer:04d}/{k:08d}"

    def due_s(self, writer: int, k: int) -> float:
        return float(self.jitter_ns[writer] + k * self.interval_ns) / 1e9

    def start_ns(self, base_ns: int, writer: int, k: int) -> int:
        """Where the samples of batch k of `writer` start, for a run that starts at `base_ns`."""
        return base_ns + int(self.jitter_ns[writer]) + (k - 1) * self.interval_ns

    def values(self, writer: int, k: int) -> int:
        return self.templates[(writer + k) % len(self.templates)].rows

    def scheduled(self, seconds: float) -> list[tuple[int, int]]:
        """(writer, k) of every batch due within the first `seconds`."""
        end_ns = round(seconds * 1e9)
        return [
            (writer, k)
            for writer, jitter in enumerate(self.jitter_ns.tolist())
            for k in range(max(0, -(-(end_ns - jitter) // self.interval_ns)))
        ]

    def payload(self, base_ns: int, writer: int, k: int) -> bytes:
        """Batch k of `writer` as a WriteRequest, for a run that starts at `base_ns`."""
        template = self.templates[(writer + k) % len(self.templates)]
        buffer = bytearray(template.payload)
        ts = np.frombuffer(buffer, "<i8", template.rows, template.ts_offset)
        ts += self.start_ns(base_ns, writer, k) - template.origin_ns
        del ts  # the buffer grows next
        host = self.host(writer)
        name = batch_pb2.Batch(batch_id=self.batch_id(writer, k), run_id=host, host=host)
        buffer += ingest_pb2.WriteRequest(batch=name).SerializeToString()
        return bytes(buffer)


def encode_templates(gpus: int, interval_ms: int, count: int) -> list[Template]:
    """`count` consecutive intervals of an agent's telemetry (samples only: its steady state),
    sampled at 10 Hz with a slow tick every second, each closed as one batch."""
    closed: list[EncodedBatch] = []
    now_ms = [START_MS - TICK_MS]
    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-") as empty:
        backend = SimulatedBackend(
            gpus, clock=lambda: now_ms[0] / 1000, started=(START_MS - WARM_MS) / 1000,
            declarations=Path(empty) / "none",
        )  # fmt: skip
        monotonic = lambda: now_ms[0] / 1000  # noqa: E731
        batcher = Batcher("fleet", "fleet", closed.append, 1 << 40, float("inf"), monotonic)  # closed when told
        sampler = Sampler(backend, batcher, Stats(), wall_ns=lambda: now_ms[0] * MS, monotonic=monotonic)
        sampler.slow_tick()  # the processes' start events: a batch of their own, not part of the steady state
        batcher.flush()
        closed.clear()
        for _ in range(count):
            for tick in range(interval_ms // TICK_MS):
                now_ms[0] += TICK_MS
                sampler.fast_tick()
                if tick % SLOW_TICKS == 0:
                    sampler.slow_tick()
            batcher.flush()
    return [_template(batch.payload, START_MS * MS + i * interval_ms * MS) for i, batch in enumerate(closed)]


def _template(payload: bytes, origin_ns: int) -> Template:
    ts: npt.NDArray[np.int64] = np.array(ingest_pb2.WriteRequest.FromString(payload).batch.samples.ts, "<i8")
    offset = payload.find(ts.tobytes())
    if offset < 0 or payload.find(ts.tobytes(), offset + 1) >= 0:
        raise AssertionError("the timestamps of a template are not one packed array in its bytes")
    return Template(payload, offset, ts.size, origin_ns)
