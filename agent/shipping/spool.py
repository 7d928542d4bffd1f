"""The disk spool: batches the server could not take yet, oldest first, each in a file
with checksums. Bounded: when full, the oldest batches are dropped and counted.

File layout (THSPOOL2): MAGIC, the crc32 of what follows up to the payload, the fields
(crc32 of the payload, sample values, payload length, batch id length), the batch id, the
payload (an encoded WriteRequest). Everything trusted before the payload is read is covered
by the first checksum, so a changed count is found when the spool is opened, not believed.
Files are written to a temporary name, synced, then renamed, so a crash never leaves a
half-written batch under a real name.

Files of the previous format (THSPOOL1: no checksum over the fields) are still replayed:
their payload's checksum is checked, and their batch id and value count are read from the
payload itself, never from the unchecked fields.

A file that fails its checks is moved aside (`NAME.corrupt`) and counted: with its value
count where that is known, as `unknown` where its header could not be trusted. A checksum is no
proof (anyone can compute one): a header whose payload length is not what the file holds, or whose
value count is more than that payload can hold, is not believed either. The folder is read as
written by others: what is not a regular file (a FIFO, a folder) is left alone with a logged line,
and no file is read past the size a spool file can have.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracehouse.regularfile import FileRefused, open_regular, read_regular

log = logging.getLogger("tracehouse.agent.spool")

MAGIC = b"THSPOOL2"
OLD_MAGIC = b"THSPOOL1"  # the previous format: FIELDS right after the magic, no checksum over them
CHECK = struct.Struct("<I")
FIELDS = struct.Struct("<IQQH")  # payload crc32, sample values, payload length, batch id length
HEAD = len(MAGIC) + CHECK.size + FIELDS.size
SUFFIX = ".batch"
SAMPLE_BYTES = 17  # the least a sample value takes in a payload: its time (8), metric (1 or more), value (8)
MAX_FILE_BYTES = 1 << 30  # a spool file is one batch, and the server takes none this large


@dataclass(frozen=True)
class EncodedBatch:
    batch_id: str
    payload: bytes  # an encoded WriteRequest
    values: int  # sample values in it


@dataclass(frozen=True)
class _Entry:
    path: Path
    batch_id: str
    values: int
    size: int


class SpoolFileError(ValueError):
    """A spool file failed a check (the message says which)."""


def encode(batch: EncodedBatch) -> bytes:
    ident = batch.batch_id.encode()
    fields = FIELDS.pack(zlib.crc32(batch.payload), batch.values, len(batch.payload), len(ident)) + ident
    return MAGIC + CHECK.pack(zlib.crc32(fields)) + fields + batch.payload


def decode_head(head: bytes, ident: bytes, size: int | None = None) -> tuple[str, int, int]:
    """Batch id, values and payload length from a THSPOOL2 header (HEAD bytes) and the batch
    id's bytes after it; SpoolFileError unless the header's checksum holds, its payload length is
    what a file of `size` bytes holds (where given), and its value count fits that payload."""
    if len(head) < HEAD or head[: len(MAGIC)] != MAGIC:
        raise SpoolFileError("not a spool file" if len(head) < HEAD else f"unknown format {head[:8]!r}")
    (check,) = CHECK.unpack_from(head, len(MAGIC))
    fields = head[len(MAGIC) + CHECK.size : HEAD]
    _, values, length, id_length = FIELDS.unpack(fields)
    if len(ident) != id_length or zlib.crc32(fields + ident) != check:
        raise SpoolFileError("header checksum mismatch: its fields were changed or damaged")
    if size is not None and HEAD + id_length + length != size:
        raise SpoolFileError(f"the header says {HEAD + id_length + length:,} bytes, the file has {size:,}")
    if values > length // SAMPLE_BYTES:
        raise SpoolFileError(
            f"the header claims {values:,} sample values, more than its {length:,}-byte payload can hold "
            f"({length // SAMPLE_BYTES:,})"
        )
    try:
        return ident.decode(), values, length
    except UnicodeDecodeError:
        raise SpoolFileError("batch id is not UTF-8") from None


def decode(data: bytes) -> EncodedBatch:
    """The batch in a whole spool file of either format; SpoolFileError when a check fails."""
    if data[: len(OLD_MAGIC)] == OLD_MAGIC:
        return _decode_old(data)
    if len(data) < HEAD:
        raise SpoolFileError("not a spool file")
    id_length = FIELDS.unpack_from(data, len(MAGIC) + CHECK.size)[3]
    batch_id, values, length = decode_head(data[:HEAD], data[HEAD : HEAD + id_length], len(data))
    crc = FIELDS.unpack_from(data, len(MAGIC) + CHECK.size)[0]
    payload = data[HEAD + id_length :]
    if len(payload) != length:
        raise SpoolFileError(f"payload of {len(payload)} bytes, the header says {length}")
    if zlib.crc32(payload) != crc:
        raise SpoolFileError("payload checksum mismatch")
    return EncodedBatch(batch_id, payload, values)


def _decode_old(data: bytes) -> EncodedBatch:
    """A THSPOOL1 file: only its payload is checked, so the batch id and value count come from it."""
    from google.protobuf.message import DecodeError

    from tracehouse.v1 import ingest_pb2

    start = len(OLD_MAGIC) + FIELDS.size
    if len(data) < start:
        raise SpoolFileError("not a spool file")
    crc, _, length, id_length = FIELDS.unpack_from(data, len(OLD_MAGIC))
    payload = data[start + id_length :]
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise SpoolFileError("payload checksum mismatch (previous spool format)")
    try:
        batch = ingest_pb2.WriteRequest.FromString(payload).batch
    except DecodeError:
        raise SpoolFileError("payload is not a batch (previous spool format)") from None
    return EncodedBatch(batch.batch_id, payload, len(batch.samples.ts))


def _lost(values: int | None) -> str:
    return "unknown" if values is None else str(values)


class Spool:
    """`on_drop(batch_id, values)` is told of every batch given up: evicted when the spool
    is full, unwritable, or found corrupt. `on_unknown(file_name)` is told of a file moved
    aside whose batch and value count are unknown (its header failed its checks); without
    it, such a file is reported to `on_drop` as ("", 0), for callers that count batches."""

    def __init__(
        self,
        folder: Path,
        max_bytes: int,
        on_drop: Callable[[str, int], None],
        on_unknown: Callable[[str], None] | None = None,
    ) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self._on_drop = on_drop
        self._on_unknown = on_unknown
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        self._sequence = 0
        self._bytes = 0
        self._full_warned = False
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            entry = self._index(path)
            if entry is not None:
                self._entries.append(entry)
                self._bytes += entry.size
            self._sequence = max(self._sequence, _sequence_of(path))
        for stale in self.folder.glob("*.tmp"):
            stale.unlink(missing_ok=True)

    def _bound(self) -> int:
        return min(self.max_bytes, MAX_FILE_BYTES)

    def _index(self, path: Path) -> _Entry | None:
        """The spool file at `path`, checked; a file that fails is moved aside, and what is no regular
        file (a FIFO, a folder) is no batch of ours: left alone, with a logged line."""
        try:
            file = open_regular(path)
        except FileRefused as error:
            log.error("spool: %s; left alone, no batch is read from it", error)
            return None
        try:
            with file:
                size = os.fstat(file.fileno()).st_size
                if size > self._bound():
                    raise SpoolFileError(f"{size:,} bytes, more than a spool file of {self._bound():,} bytes can be")
                head = file.read(HEAD)
                if head[: len(OLD_MAGIC)] == OLD_MAGIC:
                    old = _decode_old(head + file.read(size))
                    return _Entry(path, old.batch_id, old.values, size)
                id_length = FIELDS.unpack_from(head, len(MAGIC) + CHECK.size)[3] if len(head) == HEAD else 0
                batch_id, values, _ = decode_head(head, file.read(id_length), size)
            return _Entry(path, batch_id, values, size)
        except (OSError, SpoolFileError) as error:
            self._quarantine(path, str(error), "", None)
            return None

    def _quarantine(self, path: Path, why: str, batch_id: str, values: int | None) -> None:
        log.error(
            "spool file %s is corrupt (%s): moved aside as %s, values lost: %s",
            path.name, why, path.with_suffix(".corrupt").name, _lost(values),
        )  # fmt: skip
        if values is not None:
            self._on_drop(batch_id, values)
        elif self._on_unknown is not None:
            self._on_unknown(path.name)
        else:
            self._on_drop(batch_id, 0)
        try:
            path.rename(path.with_suffix(".corrupt"))
        except OSError:
            path.unlink(missing_ok=True)

    @property
    def batches(self) -> int:
        with self._lock:
            return len(self._entries)

    def values_of(self, prefix: str = "") -> int:
        with self._lock:
            return sum(e.values for e in self._entries if e.batch_id.startswith(prefix))

    @property
    def size(self) -> int:
        with self._lock:
            return self._bytes

    def put(self, batch: EncodedBatch) -> bool:
        """Append a batch, dropping the oldest to make room; False if it could not be kept."""
        data = encode(batch)
        dropped: list[_Entry] = []
        kept = True
        with self._lock:
            if len(data) > self.max_bytes:
                self._note_drop(f"batch {batch.batch_id} ({len(data)} bytes) is larger than the spool")
                kept = False
            while kept and self._entries and self._bytes + len(data) > self.max_bytes:
                oldest = self._entries.pop(0)
                self._bytes -= oldest.size
                oldest.path.unlink(missing_ok=True)
                dropped.append(oldest)
                self._note_drop(f"spool over {self.max_bytes} bytes: dropping the oldest batches")
            if kept:
                kept = self._write(batch, data)
        for entry in dropped:
            self._on_drop(entry.batch_id, entry.values)
        if not kept:
            self._on_drop(batch.batch_id, batch.values)
        return kept

    def _write(self, batch: EncodedBatch, data: bytes) -> bool:
        self._sequence += 1
        path = self.folder / f"{self._sequence:020d}{SUFFIX}"
        temporary = path.with_suffix(".tmp")
        try:
            with temporary.open("wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            temporary.replace(path)
        except OSError as error:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            self._note_drop(f"cannot write to the spool {self.folder}: {error}")
            return False
        self._entries.append(_Entry(path, batch.batch_id, batch.values, len(data)))
        self._bytes += len(data)
        self._full_warned = False
        return True

    def _note_drop(self, why: str) -> None:
        if not self._full_warned:
            log.error("%s; the values dropped are counted", why)
            self._full_warned = True

    def oldest(self) -> EncodedBatch | None:
        """The oldest intact batch; corrupt files are moved aside and counted (with the value
        count found when the spool was opened or the batch written: that one was checked)."""
        while True:
            with self._lock:
                if not self._entries:
                    return None
                entry = self._entries[0]
            try:
                batch = decode(read_regular(entry.path, entry.size))
                if (batch.batch_id, batch.values) != (entry.batch_id, entry.values):
                    raise SpoolFileError("the file changed since the spool was opened")
                return batch
            except (OSError, SpoolFileError, FileRefused) as error:
                with self._lock:
                    if self._entries and self._entries[0] == entry:
                        self._bytes -= self._entries.pop(0).size
                self._quarantine(entry.path, str(error), entry.batch_id, entry.values)

    def remove(self, batch_id: str) -> None:
        with self._lock:
            for i, entry in enumerate(self._entries):
                if entry.batch_id == batch_id:
                    del self._entries[i]
                    self._bytes -= entry.size
                    entry.path.unlink(missing_ok=True)
                    return


def _sequence_of(path: Path) -> int:
    try:
        return int(path.stem)
    except ValueError:
        return 0
