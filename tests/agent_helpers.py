"""Decode what the agent sends, for assertions."""

from __future__ import annotations

from collections import defaultdict

from agent.shipping.spool import EncodedBatch
from tracehouse.v1 import ingest_pb2


def decode(batch: EncodedBatch) -> ingest_pb2.WriteRequest:
    return ingest_pb2.WriteRequest.FromString(batch.payload)


def sample_rows(batches: list[EncodedBatch]) -> list[tuple[int, int, str, float]]:
    """(gpu, pid, metric, value) of every sample in the batches."""
    rows = []
    for encoded in batches:
        batch = decode(encoded).batch
        columns = batch.samples
        gpus = columns.gpu or [-1] * len(columns.ts)
        pids = columns.pid or [0] * len(columns.ts)
        for gpu, pid, metric, value in zip(gpus, pids, columns.metric, columns.value, strict=True):
            rows.append((gpu, pid, batch.dictionary[metric], value))
    return rows


def metrics_by_gpu(batches: list[EncodedBatch]) -> dict[int, set[str]]:
    found: dict[int, set[str]] = defaultdict(set)
    for gpu, _, metric, _ in sample_rows(batches):
        found[gpu].add(metric)
    return found


class Fates:
    """What a spool told of the batches it dropped (id, values) and of those whose loss it cannot count."""

    def __init__(self) -> None:
        self.dropped: list[tuple[str, int]] = []
        self.unknown: list[str] = []

    def drop(self, batch_id: str, values: int) -> None:
        self.dropped.append((batch_id, values))
