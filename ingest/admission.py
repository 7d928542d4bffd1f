"""Admission control for writes: a bound on the bytes the server has accepted but not yet
stored. A write that would pass it is refused at once, before any of it is validated or
stored, with a retry hint; so when the store falls behind, the agents wait and spool on
their own disks and the server's memory stays bounded.

A write is always admitted when nothing else is in flight, so a batch larger than the
bound still goes through, alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

DEFAULT_MAX_PENDING_BYTES = 256 << 20
# gRPC's standard trailer for "retry after this many milliseconds" (gRFC A6)
PUSHBACK_KEY = "grpc-retry-pushback-ms"
# in every refusal's message: clients that lose the trailer on the way still know to wait
BEHIND = "the store is behind"
MIN_RETRY_MS = 20
MAX_RETRY_MS = 5_000
_FIRST_WRITE_MS = 100.0  # what a write is assumed to take until one has been timed
_SMOOTHING = 0.2  # weight of the latest write in the running mean of write times


class Overloaded(Exception):
    """A write refused because the writes in flight already hold the bound; retry after
    `retry_ms` milliseconds."""

    def __init__(self, message: str, retry_ms: int) -> None:
        super().__init__(message)
        self.retry_ms = retry_ms


@dataclass(frozen=True)
class AdmissionCounts:
    pending_bytes: int
    pending_calls: int
    peak_bytes: int  # most bytes in flight at once
    admitted: int
    refused: int


class Admission:
    def __init__(self, max_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be above 0, not {max_bytes}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._bytes = 0
        self._calls = 0
        self._peak = 0
        self._admitted = 0
        self._refused = 0
        self._write_ms = _FIRST_WRITE_MS

    @contextlib.contextmanager
    def admit(self, size: int) -> Iterator[None]:
        """Hold `size` bytes of the bound while the block runs; Overloaded when they do not fit."""
        with self._lock:
            if self._calls and self._bytes + size > self.max_bytes:
                self._refused += 1
                retry_ms = self._retry_ms(size)
                raise Overloaded(
                    f"{BEHIND}: {self._bytes} bytes of {self._calls} writes wait to be stored, the limit is "
                    f"{self.max_bytes} (--max-pending-bytes); retry in {retry_ms} ms",
                    retry_ms,
                )
            self._bytes += size
            self._calls += 1
            self._admitted += 1
            self._peak = max(self._peak, self._bytes)
        started = time.monotonic()
        try:
            yield
        finally:
            elapsed_ms = (time.monotonic() - started) * 1000
            with self._lock:
                self._bytes -= size
                self._calls -= 1
                self._write_ms += _SMOOTHING * (elapsed_ms - self._write_ms)

    def _retry_ms(self, size: int) -> int:
        """About one write's time, scaled by how far over the bound this write would go."""
        over = (self._bytes + size) / self.max_bytes
        return int(min(MAX_RETRY_MS, max(MIN_RETRY_MS, self._write_ms * over)))

    def counts(self) -> AdmissionCounts:
        with self._lock:
            return AdmissionCounts(self._bytes, self._calls, self._peak, self._admitted, self._refused)
