"""The disk spool: batches the server could not take yet, oldest first, each in a file
with a checksum. Bounded: when full, the oldest batches are dropped and counted.

File layout: MAGIC, header (crc32 of the payload, sample values, payload length, batch id
length), batch id, payload (an encoded WriteRequest). Files are written to a temporary
name, synced, then renamed, so a crash never leaves a half-written batch under a real name.
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

log = logging.getLogger("tracehouse.agent.spool")

MAGIC = b"THSPOOL1"
HEADER = struct.Struct("<IQQH")
SUFFIX = ".batch"


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


class Spool:
    """`on_drop(batch_id, values)` is told of every batch given up: evicted when the spool
    is full, unwritable, or found corrupt."""

    def __init__(self, folder: Path, max_bytes: int, on_drop: Callable[[str, int], None]) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self._on_drop = on_drop
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

    def _index(self, path: Path) -> _Entry | None:
        try:
            with path.open("rb") as file:
                head = file.read(len(MAGIC) + HEADER.size)
                if head[: len(MAGIC)] != MAGIC or len(head) < len(MAGIC) + HEADER.size:
                    raise ValueError("not a spool file")
                _, values, _, id_length = HEADER.unpack(head[len(MAGIC) :])
                batch_id = file.read(id_length).decode()
            return _Entry(path, batch_id, values, path.stat().st_size)
        except (OSError, ValueError, UnicodeDecodeError) as error:
            self._quarantine(path, f"unreadable header ({error})", "", 0)
            return None

    def _quarantine(self, path: Path, why: str, batch_id: str, values: int) -> None:
        log.error("spool file %s is corrupt (%s): moved aside, %d values lost", path.name, why, values)
        self._on_drop(batch_id, values)
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
        ident = batch.batch_id.encode()
        data = (
            MAGIC
            + HEADER.pack(zlib.crc32(batch.payload), batch.values, len(batch.payload), len(ident))
            + ident
            + batch.payload
        )
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
        """The oldest intact batch; corrupt files are moved aside and counted."""
        while True:
            with self._lock:
                if not self._entries:
                    return None
                entry = self._entries[0]
            try:
                data = entry.path.read_bytes()
                crc, values, length, id_length = HEADER.unpack_from(data, len(MAGIC))
                payload = data[len(MAGIC) + HEADER.size + id_length :]
                if len(payload) != length or zlib.crc32(payload) != crc:
                    raise ValueError("checksum mismatch")
                return EncodedBatch(entry.batch_id, payload, values)
            except (OSError, ValueError, struct.error) as error:
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
