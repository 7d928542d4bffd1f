"""Synchronous batch writes for one-shot jobs (imports): a few calls in flight, transient
failures retried with backoff (as long as the server asks, when its store is behind), and
any failure that remains raised to the caller.

`concurrency` bounds the large requests in flight (an import's chunks: what memory holds, with up to as
many less one made and held for the next send); smaller
ones go beside them, up to MAX_CALLS in all, so that a small file's few batches reach the server
together and are stored in one group commit rather than one commit interval after another. Large
requests are sent `concurrency` at a time, together: on a store with one writer the server stores
the chunks of one month that arrive together as one insert (ingest/groupcommit.py), a fraction of
what the engine spends on each one alone, and the next ones are made while those are stored."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc

from agent.shipping.shipper import Outcome, classify
from tracehouse.batch import encode_request
from tracehouse.channel import ACCESS_REFUSED, ClientSecurity, encoded_write, explain, open_channel
from tracehouse.pushback import TRANSPORT_MAX_BYTES
from tracehouse.v1 import batch_pb2, ingest_pb2

LARGE_BYTES = 1 << 20  # a request of this size or more counts against `concurrency`
MAX_CALLS = 8
LARGE_IN_FLIGHT = 4  # large requests in flight, by default


class WriteFailed(Exception):
    """The server refused a batch, or stayed unreachable; `code` is the last gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


class BatchWriter:
    def __init__(
        self,
        server: str,
        security: ClientSecurity | None = None,
        concurrency: int = LARGE_IN_FLIGHT,
        patience: float = 60.0,
    ) -> None:
        self.server = server
        self.security = security
        self._metadata = security.metadata() if security else ()
        self._channel = open_channel(server, security, [("grpc.max_send_message_length", TRANSPORT_MAX_BYTES)])
        self._write = encoded_write(self._channel)  # encoded by the caller's thread, sent by the pool's
        calls = max(concurrency, MAX_CALLS)
        self._pool = ThreadPoolExecutor(calls, thread_name_prefix="writer")
        self._calls = threading.BoundedSemaphore(calls)
        self._large = threading.BoundedSemaphore(concurrency)
        self._concurrency = concurrency
        self._pending: list[Future[ingest_pb2.WriteResponse]] = []
        self._held: list[bytes] = []  # large requests not yet sent: `concurrency` go together
        self._patience = patience
        self.batches = 0
        self.duplicates = 0

    def write(self, batch: batch_pb2.Batch) -> None:
        """Send a batch (a large one once it makes a burst, or at the next smaller one or flush);
        blocks while `concurrency` large requests, or MAX_CALLS in all, are in flight. Raises
        WriteFailed for an earlier batch that failed."""
        self._reap(block=False)
        request = encode_request(batch)
        if len(request) >= LARGE_BYTES:
            self._held.append(request)
            if len(self._held) >= self._concurrency:
                self._send_held()
            return
        self._send_held()
        self._submit(request, [self._calls])

    def flush(self) -> None:
        """Wait for every batch written so far; raises WriteFailed if one failed."""
        self._send_held()
        self._reap(block=True)

    def _send_held(self) -> None:
        held, self._held = self._held, []
        for request in held:
            self._submit(request, [self._large, self._calls])

    def _submit(self, request: bytes, slots: list[threading.BoundedSemaphore]) -> None:
        for slot in slots:
            slot.acquire()
        future = self._pool.submit(self._send, request)
        future.add_done_callback(lambda _: _release(slots))
        self._pending.append(future)

    def _reap(self, block: bool) -> None:
        still = []
        for future in self._pending:
            if block or future.done():
                answer = future.result()  # raises WriteFailed
                self.batches += 1
                self.duplicates += int(answer.duplicate)
            else:
                still.append(future)
        self._pending = still

    def _send(self, request: bytes) -> ingest_pb2.WriteResponse:
        deadline = time.monotonic() + self._patience
        delay = 0.25
        while True:
            try:
                answer: ingest_pb2.WriteResponse = self._write(request, timeout=60, metadata=self._metadata)
                return answer
            except grpc.RpcError as error:
                code = error.code()
                outcome, asked = classify(error, len(request))
                busy = outcome is Outcome.BUSY  # the server is there: wait as long as it asks
                pause = asked * random.uniform(1.0, 1.5) if busy else delay * random.uniform(0.8, 1.2)
                if outcome is Outcome.REFUSED or code in ACCESS_REFUSED or time.monotonic() + pause > deadline:
                    raise WriteFailed(code, explain(code, error.details() or "", self.server, self.security)) from None
            time.sleep(pause)
            if not busy:
                delay = min(delay * 2, 10.0)

    def abandon(self) -> int:
        """Stop writing (Ctrl-C): batches not yet sent are not sent, those in flight are waited for;
        how many batches the server took in all."""
        self._held = []
        for future in self._pending:
            future.cancel()
        self._pool.shutdown(wait=True)
        taken = sum(1 for future in self._pending if not future.cancelled() and future.exception() is None)
        self._pending = []
        return self.batches + taken

    def close(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pool.shutdown(wait=True)
        self._channel.close()


def _release(slots: list[threading.BoundedSemaphore]) -> None:
    for slot in slots:
        slot.release()
