"""Group commit: the batches that writers send at the same time are stored together, one insert
per table for all of them, at most one group per `interval_s` (sooner once `max_rows` rows wait),
of at most `max_rows` rows (what is left waits for the next group, first in line).
So the parts the store makes, and what each insert costs, follow the data, not the number of
writers. Each writer is answered when the group holding its batch is stored (Store.write_group).

Between groups, and every `sweep_s`, unfinished groups that another server left behind are
finished (Store.finish_unfinished).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ingest.commitpolicy import CommitPolicy
from ingest.store import Store, StoreError, StoreUnavailable, WriteResult
from ingest.validate import ValidatedBatch

log = logging.getLogger(__name__)

SWEEP_S = 10.0
STORING_AT_ONCE = 2  # one group's rows go to the engine while the next is claimed
UNFINISHED_AFTER_S = 30.0  # a group unfinished for longer than this lost its server


@dataclass
class _Waiting:
    batch: ValidatedBatch
    received_ns: int
    wanted: Callable[[], bool]  # False once the writer gave up (its call was cancelled or timed out)
    rows: int
    stored: threading.Event = field(default_factory=threading.Event)
    outcome: WriteResult | Exception | None = None


class GroupCommit:
    def __init__(self, store: Store, policy: CommitPolicy | None = None, sweep_s: float = SWEEP_S) -> None:
        policy = policy or CommitPolicy()
        self.store = store
        self.interval_s = policy.interval_s
        self.max_rows = policy.max_rows
        self.sweep_s = sweep_s
        self._waiting: list[_Waiting] = []
        self._rows = 0
        self._changed = threading.Condition()
        self._last_group = -math.inf
        self._last_sweep = time.monotonic()
        self._closing = False
        self._slots = threading.Semaphore(STORING_AT_ONCE)
        self.groups = 0  # stored so far
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    def write(self, batch: ValidatedBatch, received_ns: int, wanted: Callable[[], bool] = lambda: True) -> WriteResult:
        """Store `batch` with the others waiting now; return once it is stored."""
        waiting = _Waiting(batch, received_ns, wanted, sum(batch.rows().values()))
        with self._changed:
            if self._closing:
                raise StoreUnavailable("the server is stopping: retry on another, or once it is back")
            self._waiting.append(waiting)
            self._rows += waiting.rows
            self._changed.notify()
        waiting.stored.wait()
        if isinstance(waiting.outcome, Exception):
            raise waiting.outcome
        assert waiting.outcome is not None
        return waiting.outcome

    def close(self) -> None:
        """Store what waits, then stop."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        with ThreadPoolExecutor(STORING_AT_ONCE, thread_name_prefix="group-commit") as storing:
            while True:
                self._slots.acquire()  # a group waits to be taken until it can be stored now
                with self._changed:
                    group = self._next_group()
                if group is None:
                    self._slots.release()
                    break
                if group:
                    storing.submit(self._store, group).add_done_callback(lambda _: self._slots.release())
                else:
                    self._slots.release()
                if time.monotonic() - self._last_sweep >= self.sweep_s:
                    self._sweep()
        self._sweep()

    def _next_group(self) -> list[_Waiting] | None:
        """Wait for the next group (an empty one when it is time to sweep); None once closed."""
        while True:
            now = time.monotonic()
            if self._waiting:
                due = self._last_group + self.interval_s
                if self._closing or self._rows >= self.max_rows or now >= due:
                    self._last_group = now
                    return self._take()
                self._changed.wait(due - now)
            elif self._closing:
                return None
            elif now - self._last_sweep >= self.sweep_s:
                return []
            else:
                self._changed.wait(self._last_sweep + self.sweep_s - now)

    def _take(self) -> list[_Waiting]:
        """The batches that waited longest, up to `max_rows` rows (at least one batch): a group no
        larger than that, so that what waits behind it waits for no more than one such group."""
        rows, taken = 0, 0
        for waiting in self._waiting:
            if taken and rows + waiting.rows > self.max_rows:
                break
            rows += waiting.rows
            taken += 1
        group, self._waiting = self._waiting[:taken], self._waiting[taken:]
        self._rows -= rows
        return group

    def _store(self, group: list[_Waiting]) -> None:
        gone = [waiting for waiting in group if not waiting.wanted()]
        for waiting in gone:  # left out: its writer will send it again, here or elsewhere
            waiting.outcome = StoreUnavailable("the writer gave up before its batch was stored")
            waiting.stored.set()
        group = [waiting for waiting in group if waiting.wanted()]
        if not group:
            return
        try:
            outcomes: list[WriteResult | StoreError] | list[Exception] = self.store.write_group(
                [waiting.batch for waiting in group], min(waiting.received_ns for waiting in group)
            )
        except Exception as error:  # the store failed: every writer is told, and retries
            outcomes = [error] * len(group)
        self.groups += 1
        for waiting, outcome in zip(group, outcomes, strict=True):
            waiting.outcome = outcome
            waiting.stored.set()

    def _sweep(self) -> None:
        self._last_sweep = time.monotonic()
        try:
            finished = self.store.finish_unfinished(UNFINISHED_AFTER_S)
        except StoreError as error:
            log.warning("could not look for unfinished group commits: %s", error)
            return
        if finished:
            log.warning("finished %d group commits that a stopped server had left unfinished", finished)
