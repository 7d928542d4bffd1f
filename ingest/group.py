"""A group commit's content: the batches it holds, their rows per table made one table each, and
the same as the bytes `ingest_pending` keeps, from which a group a crash left half-stored is made
again exactly as it was, so that the insert tokens that name it find what did land."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from ingest.validate import ValidatedBatch

TABLES = ("samples", "events", "runs", "devices")
_IPC = pa.ipc.IpcWriteOptions(compression="lz4")


@dataclass(frozen=True)
class Group:
    commit: int  # names the group's inserts: tokens `<commit>/<table>`
    received_ns: int
    batch_ids: tuple[str, ...]
    digests: tuple[str, ...]
    rows: tuple[Mapping[str, int], ...]  # per batch, rows per table
    tables: Mapping[str, pa.Table]  # the batches' rows, one after another, per table that has any

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
        return pa.concat_tables([part for i, part in enumerate(self.slices(table)) if i not in refused])


def new_group(batches: Sequence[ValidatedBatch], received_ns: int) -> Group:
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
