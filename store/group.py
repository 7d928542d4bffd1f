"""A group commit's content: the batches it holds, their rows per table made one table each, and
the same as the bytes `ingest_pending` keeps, from which a group a crash left half-stored is made
again exactly as it was, so that the insert tokens that name it find what did land.

A batch that stands alone (an import's chunk: events only, many, of one month) needs no copy: its
rows go to the store in one insert, one part, so it lands whole or not at all. Alone it is a group
by itself whose token depends only on the batch, so that a retry, whenever it comes, finds what
landed. Several that stand alone, of one month and one engine block together, are one group, one
insert and one part, on a store with one writer (Store.sole_writer): ingest_pending lists the group
without its rows, and a group a crash left unfinished is finished by looking for each batch's
events (its event ids, store/eventids.py), which landed with the others or not at all."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracehouse.model import INSERT_BLOCK_ROWS

TABLES = ("samples", "events", "runs", "devices")
# A batch this large is an insert worth making on its own: an import sends 65,536 events a batch.
ALONE_ROWS = 32_768
# Several that stand alone together: no more bytes than this, far below the engine's 256 MiB a block (an
# insert of more may make two parts); four chunks of an import are 25-28 MiB (Kineto, Nsight)
LONE_GROUP_BYTES = 128 << 20
# ingest_pending's `events` cell of a group listed without its rows (lone_group): this, then the month (YYYYMM)
LONE_MARK = b"lone, month "
_IPC = pa.ipc.IpcWriteOptions(compression="lz4")


class Batch(Protocol):
    """A batch as the store takes it (ingest/validate.py's ValidatedBatch is one): its id, a digest
    of its content (a batch id stored again with other content is told apart), its rows per table."""

    @property
    def batch_id(self) -> str: ...
    @property
    def digest(self) -> str: ...
    @property
    def samples(self) -> pa.Table | None: ...
    @property
    def events(self) -> pa.Table | None: ...
    @property
    def runs(self) -> pa.Table | None: ...
    @property
    def devices(self) -> pa.Table | None: ...
    def rows(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class Group:
    commit: int  # names the group's inserts: tokens `<commit>/<table>`
    received_ns: int
    batch_ids: tuple[str, ...]
    digests: tuple[str, ...]
    rows: tuple[Mapping[str, int], ...]  # per batch, rows per table
    tables: Mapping[str, pa.Table]  # the batches' rows, one after another, per table that has any
    alone: bool = False  # batches that stand alone: not copied to ingest_pending (lone_group)
    month: int = 0  # of their events (YYYYMM), when they stand alone

    @property
    def listed(self) -> bool:
        """Whether ingest_pending lists the group until it is done: every group but a lone batch's."""
        return not self.alone or len(self.batch_ids) > 1

    def token(self, table: str) -> str:
        return f"{self.commit}/{table}"

    def slices(self, table: str) -> list[pa.Table]:
        """`table`'s rows, one slice per batch (empty for a batch without any)."""
        data, offset, parts = self.tables[table], 0, []
        for counts in self.rows:
            parts.append(data.slice(offset, counts.get(table, 0)))
            offset += counts.get(table, 0)
        return parts

    def without(self, refused: set[int], table: str) -> pa.Table:
        """`table`'s rows less those of the batches at the indexes `refused`."""
        kept = [part for i, part in enumerate(self.slices(table)) if i not in refused]
        return pa.concat_tables(kept) if kept else self.tables[table].slice(0, 0)


def new_group(batches: Sequence[Batch], received_ns: int) -> Group:
    """The batches, in order, as one group under a new commit number."""
    tables = {}
    for table in TABLES:
        parts = [getattr(batch, table) for batch in batches if getattr(batch, table) is not None]
        if parts:
            tables[table] = (
                pa.concat_tables(parts, promote_options="default").unify_dictionaries() if len(parts) > 1 else parts[0]
            )
    return Group(
        commit=secrets.randbits(63),
        received_ns=received_ns,
        batch_ids=tuple(batch.batch_id for batch in batches),
        digests=tuple(batch.digest for batch in batches),
        rows=tuple(batch.rows() for batch in batches),
        tables=tables,
    )


def alone_month(batch: Batch) -> int | None:
    """The month (YYYYMM) of a batch that stands alone: at least ALONE_ROWS events, nothing else (no
    rollups follow), all in one month (the events table's partition) and one block of the engine's,
    so that its insert makes one part. None for any other batch."""
    events = batch.events
    if (
        events is None
        or not ALONE_ROWS <= events.num_rows <= INSERT_BLOCK_ROWS
        or any(table is not None for table in (batch.samples, batch.runs, batch.devices))
    ):
        return None
    bounds = pc.min_max(events.column("start").cast(pa.int64()))
    months = np.array([bounds["min"].as_py(), bounds["max"].as_py()], "datetime64[ns]").astype("datetime64[M]")
    if months[0] != months[1]:
        return None
    since_1970 = int(months[0].astype(np.int64))
    return (1970 + since_1970 // 12) * 100 + since_1970 % 12 + 1


def stands_alone(batch: Batch) -> bool:
    """Whether `batch` is stored without a copy in ingest_pending (alone_month)."""
    return alone_month(batch) is not None


def one_part(batches: Sequence[Batch]) -> bool:
    """Whether the batches, each standing alone, make one part together: one month, one engine block
    (rows, and bytes: LONE_GROUP_BYTES)."""
    months = {alone_month(batch) for batch in batches}
    events = [batch.events for batch in batches if batch.events is not None]
    return (
        len(months) == 1
        and None not in months
        and sum(table.num_rows for table in events) <= INSERT_BLOCK_ROWS
        and (len(batches) == 1 or sum(table.nbytes for table in events) <= LONE_GROUP_BYTES)
    )


def lone_group(batches: Sequence[Batch], received_ns: int) -> Group:
    """Batches that stand alone (one_part) as one group. One batch is numbered by its id and content:
    sent again, it is stored under the same insert token, which the engine drops if the first insert
    landed. Several are listed in ingest_pending under a number of their own, as any group is."""
    group = replace(new_group(batches, received_ns), alone=True, month=alone_month(batches[0]) or 0)
    if len(batches) > 1:
        return group
    digest = hashlib.sha256(f"{batches[0].batch_id}\n{batches[0].digest}".encode()).digest()
    return replace(group, commit=int.from_bytes(digest[:8], "big") >> 1)


def encode_tables(tables: Mapping[str, pa.Table]) -> dict[str, bytes]:
    """Each table as an Arrow IPC stream, LZ4-compressed (a third of the time ZSTD takes, stored or not)."""
    encoded = {}
    for name, table in tables.items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=_IPC) as writer:
            writer.write_table(table)
        encoded[name] = sink.getvalue().to_pybytes()
    return encoded


def decode_tables(payload: Mapping[str, bytes]) -> dict[str, pa.Table]:
    return {name: pa.ipc.open_stream(data).read_all() for name, data in payload.items()}
