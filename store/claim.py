"""A group commit's claim and its outcomes (WriteResult, Claim), and the rows of `ingest_pending`
that keep a claimed group, whole, until it is stored (store/writes.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from store.group import LONE_MARK, TABLES, Batch, Group, encode_tables
from store.storeerrors import BatchConflict, StoreError


@dataclass(frozen=True)
class WriteResult:
    duplicate: bool
    rows: Mapping[str, int]


@dataclass(frozen=True)
class Claim:
    """Batches of a group commit, claimed (Store.claim_group): those stored before, and the first
    of each other batch id, by index, now in the claimed group."""

    batches: Sequence[Batch]
    finished: set[str]  # batch ids whose unfinished group the claim finished
    stored: Mapping[str, tuple[str, dict[str, int]]]  # batch id -> digest and rows, stored before
    first: Mapping[str, int]  # batch id -> index of its first batch, for those claimed now
    claimed: tuple[Group, threading.Event] | None

    def settled(self, i: int) -> WriteResult | StoreError | None:
        """Batch i's outcome if the claim decides it: a batch stored before (or by the group the claim
        finished). None for the others, which only storing the claimed group decides."""
        batch = self.batches[i]
        if batch.batch_id not in self.stored:
            return None
        outcome = as_stored(batch, *self.stored[batch.batch_id])
        if isinstance(outcome, WriteResult) and batch.batch_id in self.finished:
            outcome = WriteResult(duplicate=False, rows=outcome.rows)  # its group was finished just now
        return outcome


ALREADY_CLAIMED = StoreError("claimed first by another group")  # a marker, never raised
PENDING_SCHEMA = pa.schema(
    [
        ("commit", pa.uint64()),
        ("done", pa.uint8()),
        ("received", pa.timestamp("ns", tz="UTC")),
        ("batch_ids", pa.list_(pa.string())),
        ("digests", pa.list_(pa.string())),
        ("rows", pa.list_(pa.map_(pa.string(), pa.uint32()))),
        *((table, pa.binary()) for table in TABLES),
    ]
)


def pending_row(group: Group) -> dict[str, Any]:
    """The group as ingest_pending keeps it: its batches, and their rows; for batches that stand alone
    (store/group.py), only the month of their events after LONE_MARK."""
    payload = {"events": LONE_MARK + str(group.month).encode()} if group.alone else encode_tables(group.tables)
    return {
        "commit": group.commit,
        "done": 0,
        "received": time.time_ns(),  # what the TTL counts from, whatever the writer's clock said
        "batch_ids": list(group.batch_ids),
        "digests": list(group.digests),
        "rows": [list(counts.items()) for counts in group.rows],
        **{table: payload.get(table, b"") for table in TABLES},
    }


def done_row(commit: int) -> dict[str, Any]:
    """Replaces the group's row at the next merge, and with it the group's rows kept there."""
    return {"commit": commit, "done": 1, "received": time.time_ns(), "batch_ids": [], "digests": [], "rows": []} | {
        table: b"" for table in TABLES
    }


def as_stored(batch: Batch, digest: str, counts: Mapping[str, int]) -> WriteResult | StoreError:
    """The outcome for a batch whose id is stored already with `digest`."""
    if digest != batch.digest:
        return BatchConflict(
            f"batch_id {batch.batch_id!r} was stored before with other content "
            f"({_describe(counts)}; this one has {_describe(batch.rows())}): use a new batch_id"
        )
    return WriteResult(duplicate=True, rows=batch.rows())


def stored_ns(instant: Any) -> int:
    """A DateTime64(9) as the driver reads it (an aware datetime) to ns since the epoch."""
    return int(pa.scalar(instant, pa.timestamp("ns", tz="UTC")).value)


def crash_point(name: str) -> None:
    """Tests of recovery stop a server at a named point of a group commit, as kill -9 would."""
    if os.environ.get("TRACEHOUSE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _describe(rows: Mapping[str, int]) -> str:
    return ", ".join(f"{count} {table}" for table, count in rows.items() if count) or "no rows"
