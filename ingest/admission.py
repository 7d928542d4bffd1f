"""Admission control for writes: a bound on the bytes the server has accepted but not yet
stored, and one on the writes in flight. A write that would pass either is refused at once,
before any of it is validated or stored, with a retry hint; so when the store falls behind,
the agents wait and spool on their own disks and the server's memory stays bounded.

The bound on calls is below the server's worker threads: a write waiting for the store holds
its worker, and were every worker held, further writes would wait in gRPC's queue, uncounted
and unanswered, until their deadline. With workers to spare they are refused in a moment.

A write is always admitted when nothing else is in flight, so a batch larger than the
bound still goes through, alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from tracehouse.pushback import BEHIND

DEFAULT_MAX_PENDING_BYTES = 256 << 20
DEFAULT_MAX_CALLS = 12  # when not given: create_server gives three in four of its worker threads
MIN_RETRY_MS = 20
MAX_RETRY_MS = 5_000
_FIRST_WRITE_MS = 100.0  # what a write is assumed to take until one has been timed
_SMOOTHING = 0.2  # weight of the latest write in the running mean of write times


class Overloaded(Exception):
    """A write refused because the writes in flight already hold a bound; retry after
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
    """At most `max_bytes` bytes and `max_calls` writes in flight. `max_calls` must be below
    the server's worker threads, so that some are left to refuse the writes beyond it."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_PENDING_BYTES, max_calls: int = DEFAULT_MAX_CALLS) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be above 0, not {max_bytes}")
        if max_calls <= 0:
            raise ValueError(f"max_calls must be above 0, not {max_calls}")
        self.max_bytes = max_bytes
        self.max_calls = max_calls
        self._lock = threading.Lock()
        self._bytes = 0
        self._calls = 0
        self._peak = 0
        self._admitted = 0
        self._refused = 0
        self._write_ms = _FIRST_WRITE_MS

    @contextlib.contextmanager
    def admit(self, size: int) -> Iterator[None]:
        """Hold `size` bytes of the bound and one call while the block runs; Overloaded when
        they do not fit."""
        with self._lock:
            if self._calls and (self._bytes + size > self.max_bytes or self._calls >= self.max_calls):
                self._refused += 1
                retry_ms = self._retry_ms(size)
                raise Overloaded(
                    f"{BEHIND}: {self._bytes} bytes of {self._calls} writes wait to be stored, the limits are "
                    f"{self.max_bytes} bytes (--max-pending-bytes) and {self.max_calls} writes; "
                    f"retry in {retry_ms} ms",
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
        """About one write's time, scaled by how far over a bound this write would go."""
        over = max((self._bytes + size) / self.max_bytes, (self._calls + 1) / self.max_calls)
        return int(min(MAX_RETRY_MS, max(MIN_RETRY_MS, self._write_ms * over)))

    def counts(self) -> AdmissionCounts:
        with self._lock:
            return AdmissionCounts(self._bytes, self._calls, self._peak, self._admitted, self._refused)
