"""Ships encoded batches to the Ingest service; what cannot be shipped goes to the spool.

Order is kept: while the spool holds anything, new batches join it, and the shipper sends
the oldest first. Only transient failures are retried (jittered exponential backoff that a
shutdown interrupts); a batch the server refuses as malformed is dropped and counted.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from enum import Enum

import grpc

from agent.spool import EncodedBatch, Spool
from tracehouse.v1 import ingest_pb2

log = logging.getLogger("tracehouse.agent.shipper")

PERMANENT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE}


class Outcome(Enum):
    STORED = "stored"
    RETRY = "retry"
    REFUSED = "refused"


class Shipper:
    """`on_stored(batch, values)` and `on_dropped(batch_id, values)` report every batch's fate."""

    def __init__(
        self,
        server: str,
        spool: Spool,
        on_stored: Callable[[str, int], None],
        on_dropped: Callable[[str, int], None],
        token: str | None = None,
        queue_batches: int = 16,
        call_timeout: float = 10.0,
        max_backoff: float = 30.0,
    ) -> None:
        self.server = server
        self.spool = spool
        self._on_stored = on_stored
        self._on_dropped = on_dropped
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = grpc.insecure_channel(server, options=[("grpc.max_send_message_length", 256 << 20)])
        self._write = self._channel.unary_unary(
            "/tracehouse.v1.Ingest/Write",
            request_serializer=None,  # batches travel already encoded
            response_deserializer=ingest_pb2.WriteResponse.FromString,
        )
        self._queue: collections.deque[EncodedBatch] = collections.deque()
        self._queue_batches = queue_batches
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._call_timeout = call_timeout
        self._max_backoff = max_backoff
        self._backoff = 0.0
        self._connected = True
        self._thread = threading.Thread(target=self._run, name="shipper", daemon=True)
        self._thread.start()

    def submit(self, batch: EncodedBatch) -> None:
        with self._changed:
            if self.spool.batches or len(self._queue) >= self._queue_batches:
                self._queue.append(batch)
                self._spool_queue()
            else:
                self._queue.append(batch)
            self._changed.notify_all()

    def _spool_queue(self) -> None:
        while self._queue:
            self.spool.put(self._queue.popleft())

    def pending(self) -> int:
        with self._changed:
            return len(self._queue) + self.spool.batches

    def _next(self) -> tuple[EncodedBatch, bool] | None:
        spooled = self.spool.oldest()
        if spooled is not None:
            return spooled, True
        with self._changed:
            if self._queue:
                return self._queue[0], False
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.ship_one():
                with self._changed:
                    if not self._queue and not self.spool.batches:
                        self._changed.wait(0.5)
                    continue
            if self._backoff:
                self._stop.wait(self._backoff)

    def ship_one(self) -> bool:
        """Try the oldest pending batch once; False when there was nothing to ship."""
        item = self._next()
        if item is None:
            return False
        batch, spooled = item
        outcome, detail = self._send(batch)
        if outcome is Outcome.RETRY:
            if not spooled:
                with self._changed:
                    self._spool_queue()
            self._lost(detail)
            return True
        self._found()
        if spooled:
            self.spool.remove(batch.batch_id)
        else:
            with self._changed:
                if self._queue and self._queue[0] is batch:
                    self._queue.popleft()
        if outcome is Outcome.STORED:
            self._on_stored(batch.batch_id, batch.values)
        else:
            log.error(
                "server refused batch %s for good (%s): %d values dropped",
                batch.batch_id,
                detail,
                batch.values,
            )
            self._on_dropped(batch.batch_id, batch.values)
        return True

    def _send(self, batch: EncodedBatch) -> tuple[Outcome, str]:
        try:
            self._write(batch.payload, timeout=self._call_timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            code = error.code()
            detail = f"{code.name}: {error.details()}"
            return (Outcome.REFUSED if code in PERMANENT else Outcome.RETRY), detail
        return Outcome.STORED, ""

    def _lost(self, detail: str) -> None:
        if self._connected:
            log.warning("server %s lost (%s): spooling to %s", self.server, detail, self.spool.folder)
            self._connected = False
        base = min(self._max_backoff, max(0.25, self._backoff * 2))
        self._backoff = base * random.uniform(0.8, 1.2)

    def _found(self) -> None:
        if not self._connected:
            log.warning("server %s is back: replaying %d spooled batches", self.server, self.spool.batches)
            self._connected = True
        self._backoff = 0.0

    def shutdown(self, timeout: float) -> None:
        """Stop the worker, then ship what is pending until `timeout` runs out; what is
        left goes to the spool for the next start."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + self._call_timeout)
        self._backoff = 0.0
        while time.monotonic() < deadline and self.pending():
            if not self._connected:
                # one try per half second while the server is away
                if not self.ship_one():
                    break
                if not self._connected:
                    time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            self.ship_one()
        with self._changed:
            self._spool_queue()
        self._channel.close()
