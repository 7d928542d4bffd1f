"""Ships encoded batches to the Ingest service; what cannot be shipped goes to the spool.

Order is kept: while the spool holds anything, new batches join it, and the shipper sends
the oldest first. Only transient failures are retried (jittered exponential backoff that a
shutdown interrupts); a batch the server refuses as malformed is dropped and counted. A
server whose store is behind answers RESOURCE_EXHAUSTED with a retry hint: the shipper
spools and waits as long as it asks (plus jitter), or a second without a hint (as from
gRPC's own limits or a proxy). Only a batch over the transport's size limit is dropped.
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

from agent.shipping.clockoffset import ClockOffset, measure
from agent.shipping.spool import EncodedBatch, Spool
from tracehouse.channel import ClientSecurity, encoded_write, open_channel
from tracehouse.pushback import PUSHBACK_KEY, TRANSPORT_MAX_BYTES

log = logging.getLogger("tracehouse.agent.shipper")

PERMANENT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE}
UNHINTED_PUSHBACK_S = 1.0  # the pause after a RESOURCE_EXHAUSTED without a usable retry hint
BEHIND_LOG_S = 60.0  # under steady load pauses come and go every few seconds: say so once a minute


class Outcome(Enum):
    STORED = "stored"
    RETRY = "retry"  # the server is away
    BUSY = "busy"  # the server's store is behind: it asked for a pause
    REFUSED = "refused"


def pushback_seconds(error: grpc.RpcError) -> float | None:
    """How long a RESOURCE_EXHAUSTED answer asks the writer to wait before trying again
    (the server's `grpc-retry-pushback-ms` trailer); None for another status, or without a
    usable hint: none, or a negative one (gRFC A6's "do not retry this call")."""
    if not isinstance(error, grpc.Call | grpc.aio.AioRpcError) or error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == PUSHBACK_KEY:
            try:
                milliseconds = int(value)
            except (TypeError, ValueError):
                break
            return milliseconds / 1000 if milliseconds >= 0 else None
    return None


def classify(error: grpc.RpcError, payload_bytes: int) -> tuple[Outcome, float]:
    """What a failed Write of `payload_bytes` means for its batch, and (BUSY) the seconds to
    pause before sending it again; the shipper and the import writer both decide by this.

    RESOURCE_EXHAUSTED asks for a pause: as long as the server's hint says, or
    UNHINTED_PUSHBACK_S without one, since gRPC's own limit on concurrent calls, a resource
    quota or a proxy answer it with none. Only a batch over the transport's size limit can
    never pass: REFUSED, as after a PERMANENT status. Anything else is RETRY, the server
    is away, and the caller backs off as it sees fit."""
    code = error.code() if isinstance(error, grpc.Call) else None
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if payload_bytes > TRANSPORT_MAX_BYTES:
            return Outcome.REFUSED, 0.0
        hint = pushback_seconds(error)
        return Outcome.BUSY, UNHINTED_PUSHBACK_S if hint is None else hint
    if code in PERMANENT:
        return Outcome.REFUSED, 0.0
    return Outcome.RETRY, 0.0


class Shipper:
    """`on_stored(batch, values)` and `on_dropped(batch_id, values)` report every batch's fate;
    `on_duplicate(batch_id, values)`, when given, is told instead of `on_stored` of a batch the
    server answered as one it had stored before (nothing new was stored: as when a replayed
    batch had reached the server before an agent's crash). `on_write(seconds, outcome)`, when
    set, is told of every Write call and how long it took. `clock` holds the host's clock offset to the
    server that the answered writes measure (agent/shipping/clockoffset.py), on the wall clock `wall_ns`."""

    def __init__(
        self,
        server: str,
        spool: Spool,
        on_stored: Callable[[str, int], None],
        on_dropped: Callable[[str, int], None],
        security: ClientSecurity | None = None,
        queue_batches: int = 16,
        call_timeout: float = 10.0,
        max_backoff: float = 30.0,
        on_duplicate: Callable[[str, int], None] | None = None,
        fresh_connection: bool = False,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.server = server
        self.spool = spool
        self._on_stored = on_stored
        self._on_dropped = on_dropped
        self._on_duplicate = on_duplicate or on_stored
        self._metadata = security.metadata() if security else ()
        self._channel = open_channel(
            server, security, [("grpc.max_send_message_length", TRANSPORT_MAX_BYTES)], fresh=fresh_connection
        )
        self._write = encoded_write(self._channel)
        self._wall_ns = wall_ns
        self.clock = ClockOffset()
        self._queue: collections.deque[EncodedBatch] = collections.deque()
        self._queue_batches = queue_batches
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._call_timeout = call_timeout
        self._max_backoff = max_backoff
        self._backoff = 0.0
        self._connected = True
        self._busy = False  # the server asked for a pause and has not stored a batch since
        self._busy_said = -BEHIND_LOG_S
        self.on_write: Callable[[float, Outcome], None] | None = None
        self.on_capture_waiting: Callable[[], None] | None = None  # a write's answer said a capture is asked
        self.busy_answers = 0  # RESOURCE_EXHAUSTED answers with a retry hint
        self.spooled_batches = 0  # batches that went to the spool rather than straight out
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
            self.spooled_batches += 1

    @property
    def channel(self) -> grpc.Channel:
        """The channel the batches go over, for the few other calls a writer makes (Capture)."""
        return self._channel

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._metadata)

    @property
    def connected(self) -> bool:
        """False from a failed send until one succeeds: the server is away."""
        return self._connected

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
        outcome, detail, pause, duplicate = self._send(batch)
        if outcome is Outcome.RETRY or outcome is Outcome.BUSY:
            if not spooled:
                with self._changed:
                    self._spool_queue()
            if outcome is Outcome.BUSY:
                self._behind(detail, pause)
            else:
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
            (self._on_duplicate if duplicate else self._on_stored)(batch.batch_id, batch.values)
        else:
            log.error(
                "server refused batch %s for good (%s): %d values dropped",
                batch.batch_id,
                detail,
                batch.values,
            )
            self._on_dropped(batch.batch_id, batch.values)
        return True

    def _send(self, batch: EncodedBatch) -> tuple[Outcome, str, float, bool]:
        """The outcome, what the server said, (BUSY) the pause it asked for in seconds, and
        (STORED) whether the server had stored the batch before."""
        sent = self._wall_ns()
        started = time.monotonic_ns()
        outcome, detail, pause, duplicate = Outcome.STORED, "", 0.0, False
        try:
            answer = self._write(batch.payload, timeout=self._call_timeout, metadata=self._metadata)
            answered = time.monotonic_ns()
            self.clock.add(measure(sent, started, answered, answer.server_received_ns, answer.server_time_ns))
            duplicate = bool(answer.duplicate)
            if answer.capture_waiting and self.on_capture_waiting is not None:
                self.on_capture_waiting()
        except grpc.RpcError as error:
            detail = f"{error.code().name}: {error.details()}"
            outcome, pause = classify(error, len(batch.payload))
        if self.on_write is not None:
            self.on_write((time.monotonic_ns() - started) / 1e9, outcome)
        return outcome, detail, pause, duplicate

    def _lost(self, detail: str) -> None:
        if self._connected:
            log.warning("server %s lost (%s): spooling to %s", self.server, detail, self.spool.folder)
            self._connected = False
        self._busy = False
        base = min(self._max_backoff, max(0.25, self._backoff * 2))
        self._backoff = base * random.uniform(0.8, 1.2)

    def _behind(self, detail: str, pause: float) -> None:
        """The server is there but its store is behind: wait as long as it asks, and a little
        more, so that agents told at the same moment do not all come back at once."""
        self.busy_answers += 1
        if not self._busy:
            now = time.monotonic()
            if now - self._busy_said >= BEHIND_LOG_S:
                log.warning("server %s is behind (%s): spooling to %s, retrying as it asks (said once a minute)",
                            self.server, detail, self.spool.folder)  # fmt: skip
                self._busy_said = now
            self._busy = True
        self._backoff = min(self._max_backoff, max(0.01, pause)) * random.uniform(1.0, 1.5)

    def _found(self) -> None:
        if not self._connected:
            log.warning("server %s is back: replaying %d spooled batches", self.server, self.spool.batches)
            self._connected = True
        if self._busy:
            log.debug("server %s caught up: replaying %d spooled batches", self.server, self.spool.batches)
            self._busy = False
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
            if not self.ship_one():
                break
            if self._backoff:
                # one try per half second while the server is away; the pause it asks for while it is behind
                pause = self._backoff if self._busy else 0.5
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        with self._changed:
            self._spool_queue()
        self._channel.close()
