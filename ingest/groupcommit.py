"""Group commit: the batches that writers send at the same time are stored together, one insert
per table for all of them, at most one group per `interval_s` (sooner once `max_rows` rows wait, or
a batch of ALONE_ROWS rows or more, an insert worth making on its own: an import's chunk), of at
most `max_rows` rows (what is left waits for the next group, first in line). On a store with one
writer, batches that stand alone (store/group.py) sent together are one group, one insert and one
part: they wait for more of their month while one arrived within LONE_GAP_S (LONE_WAIT_S at most),
and while a group is storing (the server's own pace holds them together), up to LONE_GROUP_ROWS rows
(an importer sends its chunks four at a time: agent/shipping/writer.py).
Four at a time, the engine stored a 1 M-event import for 0.85-1.00 µs of CPU an event, merges
included; one at a time, for 1.43-1.54.
So the parts the store makes, and what each insert costs, follow the data, not the number of
writers. Each writer is answered when the group holding its batch is stored, or once the group is
claimed (Store.claim_group: from then on it is stored once whatever fails) when storing it takes
longer than `answer_within_s`, when it is a bulk writer's (`bulk_rows` rows or more), or while
`answer_at_claim()` says so (the admission turns writers away: ingest/admission.py). Batches that
describe runs are answered only once stored, and are stored after every group taken before them:
what their writers send next may read them. A batch
that stands alone (store/group.py: an import's chunk) is a group by itself, or with others that stand
alone, answered once stored.
A read waits for the groups whose writers were answered before they were stored (`settle_answered`):
whoever reads this server sees every write it answered.

At start, before any write is taken, every group left unfinished on the store is finished: those
of this server before it was stopped, and any another server is storing at that moment (stored by
both, nothing twice: Store.finish_unfinished). Every `sweep_s`, groups unfinished for longer than
UNFINISHED_AFTER_S, whose server stopped and was not started again, are finished.
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
from ingest.validate import ValidatedBatch
from store.claim import WriteResult
from store.group import ALONE_ROWS, alone_month
from store.store import Store
from store.storeerrors import StoreError, StoreUnavailable

log = logging.getLogger(__name__)

SWEEP_S = 10.0
SETTLE_WITHIN_S = 10.0  # a read waits no longer than this for the groups answered before they were stored
STORING_AT_ONCE = 2  # one group's rows go to the engine while the next is claimed
UNFINISHED_AFTER_S = 30.0  # a group unfinished for longer than this lost its server
LONE_GAP_S = 0.1  # batches that stand alone wait for more while one arrived within this
LONE_WAIT_S = 0.5  # and no longer than this from the first
LONE_GROUP_ROWS = 4 * 65_536  # once this many rows of them wait, they are a group at once
# A batch of ALONE_ROWS rows does not wait for the interval: an import sends 65,536 events a batch, and
# waiting held it to one batch per interval (about 330 k events/s at 200 ms).


@dataclass
class _Waiting:
    batch: ValidatedBatch
    received_ns: int
    wanted: Callable[[], bool]  # False once the writer gave up (its call was cancelled or timed out)
    rows: int
    on_stored: Callable[[], None]
    on_taken: Callable[[], None]  # called for a batch that stands alone once its group is taken
    month: int | None  # of a batch that stands alone (store/group.py): answered only once stored
    group_stored: threading.Event | None = None  # its group's, once taken; set once the group is stored or failed
    stored: threading.Event = field(default_factory=threading.Event)
    claimed: threading.Event = field(default_factory=threading.Event)  # set with `stored` too
    outcome: WriteResult | Exception | None = None
    arrived: float = field(default_factory=time.monotonic)

    @property
    def alone(self) -> bool:
        return self.month is not None

    @property
    def may_answer_early(self) -> bool:
        # a run's description is read by what its writer sends next; a batch that stands alone has no
        # copy in ingest_pending, from which a claimed group is stored whatever fails
        return self.batch.runs is None and not self.alone

    def settle(self, outcome: WriteResult | Exception) -> None:
        self.outcome = outcome
        self.stored.set()
        self.claimed.set()
        self.on_stored()


class GroupCommit:
    def __init__(
        self, store: Store, policy: CommitPolicy | None = None, sweep_s: float = SWEEP_S,
        answer_at_claim: Callable[[], bool] = lambda: False,
    ) -> None:  # fmt: skip
        policy = policy or CommitPolicy()
        self.store = store
        self.interval_s = policy.interval_s
        self.max_rows = policy.max_rows
        self.answer_within_s = policy.answer_within_s
        self.bulk_rows = policy.bulk_rows
        self.answer_at_claim = answer_at_claim
        self.sweep_s = sweep_s
        self._waiting: list[_Waiting] = []
        self._rows = 0
        self._alone = 0  # batches waiting of ALONE_ROWS rows or more
        self._lone_rows = 0  # rows waiting of batches that stand alone
        self._lone_arrived = 0.0  # when the last of them arrived
        self._lone_groups = store.sole_writer  # several that stand alone make one group (store/group.py)
        self._changed = threading.Condition()
        self._last_group = -math.inf
        self._last_sweep = time.monotonic()
        self._closing = False
        self.groups = 0  # stored so far
        self.answered_early = 0  # writers answered once their group was claimed, before it was stored
        self._storing: set[threading.Event] = set()  # groups taken and not yet stored; each set once stored
        self._answered: set[threading.Event] = set()  # of those, the groups with writers answered already
        self._sweep(older_than_s=0.0)  # a crash's leftovers, before any write or read of this server
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    def write(
        self, batch: ValidatedBatch, received_ns: int, wanted: Callable[[], bool] = lambda: True,
        on_stored: Callable[[], None] = lambda: None, on_taken: Callable[[], None] = lambda: None,
    ) -> WriteResult:  # fmt: skip
        """Store `batch` with the others waiting now; return once it is stored, or once its group is
        claimed (so stored once, whatever fails) if storing it takes longer than `answer_within_s`
        from now, or if `answer_at_claim()` says so now. Batches that describe runs wait until stored:
        what a writer sends after them may read them. `on_stored` is called once the batch is stored,
        or refused, in any case; `on_taken`, for a batch that stands alone, once its group is taken."""
        rows = sum(batch.rows().values())
        waiting = _Waiting(batch, received_ns, wanted, rows, on_stored, on_taken, alone_month(batch))
        with self._changed:
            if self._closing:
                raise StoreUnavailable("the server is stopping: retry on another, or once it is back")
            self._waiting.append(waiting)
            self._rows += waiting.rows
            self._alone += waiting.rows >= ALONE_ROWS
            if waiting.alone:
                self._lone_rows += waiting.rows
                self._lone_arrived = waiting.arrived
            # the group's thread waits for the interval, or for a store to finish, whatever arrives
            # meanwhile; only these change what it waits for (woken by every write, it woke 600 times a
            # second under `bench load --writers 1000`)
            if len(self._waiting) == 1 or self._rows >= self.max_rows or waiting.rows >= ALONE_ROWS:
                self._changed.notify()
        bulk = self.bulk_rows is not None and rows >= self.bulk_rows
        within_s = 0.0 if bulk or self.answer_at_claim() else self.answer_within_s
        if waiting.may_answer_early and within_s is not None:
            waiting.stored.wait(within_s)
            waiting.claimed.wait()
        else:
            waiting.stored.wait()
        if not waiting.stored.is_set():  # stored once whatever fails: the group is claimed
            self.answered_early += 1
            with self._changed:
                assert waiting.group_stored is not None  # claimed: taken
                if not waiting.group_stored.is_set():
                    self._answered.add(waiting.group_stored)
            return WriteResult(duplicate=False, rows=batch.rows())
        if isinstance(waiting.outcome, Exception):
            raise waiting.outcome
        assert waiting.outcome is not None
        return waiting.outcome

    def settle_answered(self, within_s: float = SETTLE_WITHIN_S) -> None:
        """Wait (up to `within_s`) for the groups whose writers were answered before they were stored, so
        that a read that follows sees every write answered before it."""
        with self._changed:
            answered = list(self._answered)
        deadline = time.monotonic() + within_s
        for group_stored in answered:
            group_stored.wait(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Store what waits, then stop."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        with ThreadPoolExecutor(STORING_AT_ONCE, thread_name_prefix="group-commit") as storing:
            while True:
                with self._changed:
                    group = self._next_group()
                    if group:
                        stored = threading.Event()
                        earlier, self._storing = set(self._storing), self._storing | {stored}
                        for waiting in group:
                            waiting.group_stored = stored
                if group is None:
                    break
                if group:
                    storing.submit(self._store, group, stored, earlier)
                if time.monotonic() - self._last_sweep >= self.sweep_s:
                    self._sweep()
        self._sweep()
        try:
            self.store.mark_done()
        except StoreError as error:
            log.warning("could not mark the last group commits done (the next start stores them again): %s", error)

    def _next_group(self) -> list[_Waiting] | None:
        """Wait for the next group (an empty one when it is time to sweep); None once closed. A group
        is taken once a store can take it: under load, groups grow rather than queue."""
        while True:
            now = time.monotonic()
            if self._waiting:
                head = self._waiting[0]
                lone = head.alone and self._lone_groups
                if lone:  # a moment for the batches sent with it
                    due = min(head.arrived + LONE_WAIT_S, self._lone_arrived + LONE_GAP_S)
                    early = self._lone_rows < LONE_GROUP_ROWS
                else:
                    due = self._last_group + self.interval_s
                    early = self._rows < self.max_rows and not self._alone
                if not self._closing and early and now < due:
                    self._changed.wait(due - now)
                elif self._closing or len(self._storing) < (1 if lone else STORING_AT_ONCE):
                    self._last_group = now
                    return self._take()
                else:
                    self._changed.wait()
            elif self._closing:
                return None
            elif now - self._last_sweep >= self.sweep_s:
                return []
            else:
                self._changed.wait(self._last_sweep + self.sweep_s - now)

    def _take(self) -> list[_Waiting]:
        """The batches that waited longest, up to `max_rows` rows (at least one batch): a group no
        larger than that, so that what waits behind it waits for no more than one such group. A batch
        that stands alone is a group by itself, or with those of its month that stand alone, on a store
        with one writer, up to LONE_GROUP_ROWS rows."""
        head = self._waiting[0]
        limit = min(self.max_rows, LONE_GROUP_ROWS) if head.alone else self.max_rows
        rows, taken = 0, 0
        for waiting in self._waiting:
            if taken and (rows + waiting.rows > limit or not self._joins(head, waiting)):
                break
            rows += waiting.rows
            taken += 1
        group, self._waiting = self._waiting[:taken], self._waiting[taken:]
        self._rows -= rows
        self._alone -= sum(waiting.rows >= ALONE_ROWS for waiting in group)
        self._lone_rows -= sum(waiting.rows for waiting in group if waiting.alone)
        for waiting in group:
            if waiting.alone:
                waiting.on_taken()
        return group

    def _joins(self, head: _Waiting, waiting: _Waiting) -> bool:
        """Whether `waiting` may be in the group of `head`: neither stands alone, or both do, of one month."""
        if head.alone or waiting.alone:
            return self._lone_groups and head.month == waiting.month
        return True

    def _store(self, group: list[_Waiting], stored: threading.Event, earlier: set[threading.Event]) -> None:
        try:
            self._claim_and_store(group, earlier)
        finally:
            with self._changed:
                stored.set()
                self._storing.discard(stored)
                self._answered.discard(stored)
                self._changed.notify()

    def _claim_and_store(self, group: list[_Waiting], earlier: set[threading.Event]) -> None:
        gone = [waiting for waiting in group if not waiting.wanted()]
        for waiting in gone:  # left out: its writer will send it again, here or elsewhere
            waiting.settle(StoreUnavailable("the writer gave up before its batch was stored"))
        group = [waiting for waiting in group if waiting.wanted()]
        if not group:
            return
        batches = [waiting.batch for waiting in group]
        try:
            claim = self.store.claim_group(batches, min(waiting.received_ns for waiting in group))
        except Exception as error:  # the store failed: every writer is told, and retries
            for waiting in group:
                waiting.settle(error)
            return
        for i, waiting in enumerate(group):
            settled = claim.settled(i)
            if settled is not None:
                waiting.settle(settled)
            waiting.claimed.set()
        if any(batch.runs is not None for batch in batches):
            for other in earlier:  # what was answered before this run's description is stored first
                other.wait()
        try:
            outcomes: list[WriteResult | StoreError] | list[Exception] = self.store.store_claimed(claim)
        except Exception as error:  # a retry finishes the group, or the sweep: it is claimed
            log.warning("a claimed group commit is left for a retry or the sweep to finish: %s", error)
            outcomes = [error] * len(group)
        self.groups += 1
        for waiting, outcome in zip(group, outcomes, strict=True):
            if not waiting.stored.is_set():
                waiting.settle(outcome)

    def _sweep(self, older_than_s: float = UNFINISHED_AFTER_S) -> None:
        self._last_sweep = time.monotonic()
        try:
            finished = self.store.finish_unfinished(older_than_s)
        except StoreError as error:
            log.warning("could not look for unfinished group commits: %s", error)
            return
        except Exception:  # a fault of ours: the writes go on, and the next sweep tries again
            log.exception("could not finish the unfinished group commits")
            return
        if finished:
            left = "left unfinished on the store" if older_than_s == 0 else "that a stopped server had left unfinished"
            log.warning("finished %d group commits %s", finished, left)
