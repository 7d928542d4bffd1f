"""A group commit's content: the batches it holds, their rows per table made one table each, and
the same as the bytes `ingest_pending` keeps, from which a group a crash left half-stored is made
again exactly as it was, so that the insert tokens that name it find what did land.

A batch that stands alone (an import's chunk: events only, many, of one month) is a group by itself
and needs no copy: its rows go to the store in one insert, one part, so it lands whole or not at
all, and its token depends only on the batch, so that a retry, whenever it comes, finds what landed."""

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
    alone: bool = False  # one batch that stands alone: not copied to ingest_pending

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


def stands_alone(batch: Batch) -> bool:
    """Whether `batch` is stored as a group of its own, without a copy in ingest_pending: at least
    ALONE_ROWS events, nothing else (no rollups follow), all in one month (the events table's
    partition) and one block of the engine's, so that its insert makes one part."""
    events = batch.events
    if (
        events is None
        or not ALONE_ROWS <= events.num_rows <= INSERT_BLOCK_ROWS
        or any(table is not None for table in (batch.samples, batch.runs, batch.devices))
    ):
        return False
    bounds = pc.min_max(events.column("start").cast(pa.int64()))
    months = np.array([bounds["min"].as_py(), bounds["max"].as_py()], "datetime64[ns]").astype("datetime64[M]")
    return bool(months[0] == months[1])


def lone_group(batch: Batch, received_ns: int) -> Group:
    """A batch that stands alone as its group, numbered by its id and content: sent again, it is
    stored under the same insert token, which the engine drops if the first insert landed."""
    digest = hashlib.sha256(f"{batch.batch_id}\n{batch.digest}".encode()).digest()
    return replace(new_group([batch], received_ns), commit=int.from_bytes(digest[:8], "big") >> 1, alone=True)


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
