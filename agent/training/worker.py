"""The worker's side of a run (its thread `tracehouse-run`): it drains the caller's buffer into
events and samples, closes batches (the agent's Batcher) that the agent's Shipper sends, and at
the end gives what is pending one try."""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any

from agent.training.records import (
    _PHASE,
    _SCALAR,
    _STEP,
    _STEP_END,
    BATCH_EVENTS,
    CALL_TIMEOUT_S,
    DRAIN_INTERVAL_S,
    MAX_NAME_BYTES,
    MAX_TEXT_BYTES,
    STEP_NAME,
    STEP_STARTS_KEPT,
    _EventColumns,
    _fits,
    _perf_ns,
    log,
)
from agent.training.torch_support import _CudaValue

if TYPE_CHECKING:
    import collections

    from agent.shipping.batcher import Batcher
    from agent.shipping.shipper import Shipper
    from agent.shipping.spool import Spool
    from agent.training.capture import Capturer
    from tracehouse.channel import ClientSecurity


class _RunWorker:
    """The part of Run that its worker thread runs (and `_describe`, which describes the run
    to the Batcher at its start and end). Run sets the attributes below."""

    name: str
    tags: dict[str, str]
    host: str
    pid: int
    started_ns: int
    run_id: str
    server: str
    dropped: int
    batcher: Batcher
    shipper: Shipper
    spool: Spool
    _base_ns: int
    _buffer: collections.deque[tuple[Any, ...]]
    _stop: threading.Event
    _status: str
    _end_ns: int | None
    _end_timeout: float
    _security: ClientSecurity | None
    _counts: dict[str, int]
    _attrs: dict[str, str]
    _lock_file: Any
    _columns: _EventColumns
    _open_steps: dict[int, tuple[int, Any]]
    _step_starts: dict[Any, int]
    _capturer: Capturer | None

    def _describe(self, end: int | None) -> None:
        attrs = dict(self._attrs)
        if end is not None:
            attrs.update(status=self._status, **{k: str(v) for k, v in self._counts.items() if "batches" not in k})
            attrs["dropped_records"] = str(self.dropped)
        self.batcher.describe_run(
            run_id=self.run_id, name=self.name, host=self.host, source="user", start=self.started_ns,
            end=end, tags=self.tags, attrs=attrs,
        )  # fmt: skip

    def _batch_stored(self, batch_id: str, values: int) -> None:
        self._counts["stored_batches"] += 1

    def _batch_dropped(self, batch_id: str, values: int) -> None:
        self._counts["dropped_batches"] += 1

    # -- the worker's side ---------------------------------------------------------------------

    def _work(self) -> None:
        try:
            while not self._stop.wait(DRAIN_INTERVAL_S):
                self._drain()
                if self._capturer is not None and self._capturer.asked.is_set():
                    self._capturer.poll()
                if self.batcher.due():
                    self._flush()
        except Exception:
            log.exception("tracehouse: run %s: recording failed; the training goes on", self.run_id)
        try:
            self._finish()
        except Exception:
            log.exception("tracehouse: run %s: could not ship its end", self.run_id)

    def _drain(self) -> None:
        buffer = self._buffer
        for _ in range(len(buffer)):
            record = buffer.popleft()
            tag = record[0]
            if tag == _PHASE:
                _, start, end, name, depth, tid = record
                if self._event("phase", start, max(start, end), name, tid=tid, depth=depth):
                    self._counts["phases"] += 1
            elif tag == _STEP:
                _, t, i, tid = record
                self._close_step(tid, t)
                self._open_steps[tid] = (t, i)
                self._step_starts[i] = t
                if len(self._step_starts) > STEP_STARTS_KEPT:
                    del self._step_starts[next(iter(self._step_starts))]
            elif tag == _SCALAR:
                self._scalar(*record[1:])
            elif tag == _STEP_END:
                self._close_step(record[2], record[1])
            else:  # _THREAD
                _, t, tid, thread_name = record
                self._event("thread", t, t, thread_name, tid=tid)
            if len(self._columns) >= BATCH_EVENTS:
                self._flush()

    def _event(self, kind: str, start: int, end: int, name: Any, tid: int, depth: int = 0, **extras: str) -> bool:
        text = name if isinstance(name, str) else str(name)
        if not _fits(text, MAX_TEXT_BYTES):
            self._invalid(f"a {kind} name of {len(text.encode())} bytes (the limit is {MAX_TEXT_BYTES})")
            return False
        self._columns.add(kind, start, end, text, tid=tid, depth=depth, extras=extras)
        return True

    def _close_step(self, tid: int, t: int) -> None:
        opened = self._open_steps.pop(tid, None)
        if opened is not None:
            start, i = opened
            self._event("step", start, max(t, start), STEP_NAME, tid=tid, step=str(i))
            self._counts["steps"] += 1

    def _scalar(self, t: int, name: Any, value: Any, step: Any) -> None:
        try:
            if isinstance(value, _CudaValue):
                value.ready.synchronize()
                value = value.value
            number = float(value.item() if hasattr(value, "item") else value)
        except Exception:
            number = math.nan
        if not isinstance(name, str) or not name or not _fits(name, MAX_NAME_BYTES):
            self._invalid(f"scalar name {str(name)[:64]!r} (names are 1..{MAX_NAME_BYTES} bytes)")
        elif not math.isfinite(number):
            self._invalid(f"scalar {name!r}: {str(value)[:64]} is not a finite number")
        else:
            ts = self._step_starts.get(step, t) if step is not None else t
            self.batcher.add(ts, -1, {name: number}, pid=self.pid)
            self._counts["scalars"] += 1

    def _invalid(self, what: str) -> None:
        self._counts["invalid"] += 1
        if self._counts["invalid"] == 1:
            log.warning("tracehouse: run %s: %s left out (said once; counted in the run's attrs)", self.run_id, what)

    def _flush(self) -> None:
        """Close a batch: the events gathered since the last one, and the Batcher's samples and
        run descriptions. Events wait here, not in the Batcher, so that their count bounds a batch."""
        columns = self._columns
        if len(columns):
            self.batcher.add_events(
                columns.kind, columns.start, columns.end, columns.name, extras=columns.extras,
                pid=self.pid, tid=columns.tid, depth=columns.depth,
            )  # fmt: skip
            self._columns = _EventColumns()
        self.batcher.flush()

    def _finish(self) -> None:
        from agent.runs.runspool import remove_spool

        self._drain()
        end = max(self.started_ns, self._end_ns if self._end_ns is not None else _perf_ns() + self._base_ns)
        for tid in list(self._open_steps):
            self._close_step(tid, end)
        self._describe(end)
        self._flush()
        self._ship_pending(time.monotonic() + self._end_timeout)
        if self.spool.batches:
            log.warning(
                "tracehouse: %d batches of run %s wait in %s (server %s away); the next run on this machine sends them",
                self.spool.batches, self.run_id, self.spool.folder, self.server,
            )  # fmt: skip
            if self._lock_file is not None:
                self._lock_file.close()  # the spool is the next run's to send
        else:
            remove_spool(self.spool.folder, self._lock_file)

    def _ship_pending(self, deadline: float) -> None:
        """The end's one try: ship what is pending until the deadline, or until a send fails.
        While the server answers (nothing is spooled), the shipper's thread goes on, and a
        send that fails spools what is queued, which ends the try. Where the server was away
        before the end (the shipper may be waiting out a long backoff), a shipper of the end's
        own tries the spool at once, oldest batch first, until a send fails."""
        from agent.shipping.shipper import Outcome, Shipper

        shipper = self.shipper
        away_before = self.spool.batches > 0
        while not self.spool.batches and shipper.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        failed_now = not away_before and self.spool.batches > 0
        shipper.shutdown(0.0)  # stops its thread; what is still queued goes to the spool
        if failed_now or not self.spool.batches or time.monotonic() >= deadline:
            return
        failed = threading.Event()

        def on_write(_seconds: float, outcome: Outcome) -> None:
            if outcome is Outcome.RETRY:
                failed.set()

        retry = Shipper(
            self.server, self.spool, on_stored=self._batch_stored, on_dropped=self._batch_dropped,
            security=self._security, call_timeout=CALL_TIMEOUT_S, fresh_connection=True,
        )  # fmt: skip
        retry.on_write = on_write
        while self.spool.batches and time.monotonic() < deadline and not failed.wait(0.01):
            pass
        retry.shutdown(0.0)
