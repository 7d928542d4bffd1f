"""Admission control for writes: bounds on the bytes the server has accepted but not yet stored,
on the writes in flight, and on how long a write would wait. A write that would pass any is refused
at once, before any of it is validated or stored, with a retry hint; so when the store falls behind,
the agents wait and spool on their own disks, the server's memory stays bounded, and the writes it
takes are answered well within the writers' deadlines.

The bound on calls is below the server's worker threads: a write waiting for the store holds
its worker, and were every worker held, further writes would wait in gRPC's queue, uncounted
and unanswered, until their deadline. With workers to spare they are refused in a moment.

The wait is foreseen from the bytes in flight and the pace at which writes have been finishing over
the last seconds (Little's law): a write is refused when what is ahead of it, and itself, would take
longer than `target_ms` at that pace. That bound holds only while the writes of the last seconds took
more than half the target on average: until then the store keeps up, and the pace is what writers
offer, not what the store can do. Until writes have finished lately, at most FIRST_CALLS are taken.

A write refused once the pace is known is given a turn (the retry hint): after the turns given
before it, each as long as its write takes at that pace, and never more than MAX_RETRY_MS ahead.
Writers come back one after another, at the pace the store takes them, and most calls find room: a
thousand writers whose hints only said when room would be made came back together, and four in five
of their calls were refused, at a third of the server's CPU.

Turns serve a burst, not a crowd. Once more writes were refused over the last PACE_WINDOW_S than the
server takes at once, more writers want to write than the store can take (writers that are behind
send their next batch as soon as one is answered, and take the room a turn was counting on), and a
writer turned away is asked to come back once the store will have taken, at the recent pace, the
writes in flight and those that the writers turned away before it bring back: at least MIN_CROWD_MS
(its spool holds its data, and each of its calls refused costs the server as much CPU as one it
stores), at most MAX_RETRY_MS. So a crowd comes back spread out at the pace the store takes it. One
pause for the whole crowd (MAX_RETRY_MS) brought it back at once: when a thousand writers started
together, seven hundred were turned away in the first two seconds, the server then sat idle for
eight while they waited, and turned most of them away again at their return. While turns given or
writers turned away are yet to come back, the bound stays on however quickly writes finish.

A write is always admitted when nothing else is in flight, so a batch larger than the
bound still goes through, alone.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tracehouse.pushback import BEHIND

DEFAULT_MAX_PENDING_BYTES = 256 << 20
DEFAULT_MAX_CALLS = 12  # when not given: create_server gives three in four of its worker threads
DEFAULT_TARGET_MS = 700  # the slowest writes a server takes wait about one and a half times the target
FIRST_CALLS = 256  # writes taken at once while the pace is unknown
PACE_WINDOW_S = 3.0  # writes finished this long ago or less set the pace
FIRST_WRITE_MS = 100  # what a write is taken to last while the pace is unknown
MIN_RETRY_MS = 20
MIN_CROWD_MS = 1_000
MAX_RETRY_MS = 10_000


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


class Admitted:
    """An admitted write's bytes, held until `release` (once its batch is stored, or refused). How long
    it took counts until then, or until `taken`: a batch that stands alone is answered once stored with
    those sent with it (ingest/groupcommit.py), and storing them, not waiting, is what the rest of its
    time was (four chunks of a Kineto trace took over half the target so, on a store that kept up, and
    the wait bound turned the next ones away: the import took 8.5-9.9 s instead of 5.8-6.4)."""

    def __init__(self, admission: Admission, size: int, started: float) -> None:
        self._admission = admission
        self._size = size
        self._started = started
        self._took: float | None = None
        self._released = False
        self.handed_over = False  # to whoever calls release: the call's end does not

    def hand_over(self) -> Callable[[], None]:
        self.handed_over = True
        return self.release

    def taken(self) -> None:
        """Its batch is in a group being stored: its wait ends here."""
        if self._took is None:
            self._took = self._admission._clock() - self._started

    def release(self) -> None:
        if not self._released:
            self._released = True
            took = self._took if self._took is not None else self._admission._clock() - self._started
            self._admission._stored(self._size, took)


class Admission:
    """At most `max_bytes` bytes and `max_calls` writes in flight, and no more than are stored within
    `target_ms` at the recent pace. `max_calls` must be below the server's worker threads, so that some
    are left to refuse the writes beyond it."""

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_PENDING_BYTES, max_calls: int = DEFAULT_MAX_CALLS,
        target_ms: float = DEFAULT_TARGET_MS, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be above 0, not {max_bytes}")
        if max_calls <= 0:
            raise ValueError(f"max_calls must be above 0, not {max_calls}")
        if target_ms <= 0:
            raise ValueError(f"target_ms must be above 0, not {target_ms}")
        self.max_bytes = max_bytes
        self.max_calls = max_calls
        self.target_ms = target_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._bytes = 0
        self._calls = 0
        self._peak = 0
        self._admitted = 0
        self._refused = 0
        self._finished: collections.deque[tuple[float, int, float]] = collections.deque()  # (when, bytes, took)
        self._finished_bytes = 0  # their sums
        self._finished_took = 0.0
        self._next_turn = 0.0  # when the turns given to writes turned away end
        self._back_by = 0.0  # when every writer turned away so far is due back
        self._refusals: collections.deque[float] = collections.deque()  # when, over the last PACE_WINDOW_S
        self._away: list[tuple[float, int]] = []  # a crowd turned away, not yet due back: (when, bytes), a heap
        self._away_bytes = 0
        self._first_finished = 0.0

    @contextlib.contextmanager
    def admit(self, size: int, deadline_s: float | None = None) -> Iterator[Admitted]:
        """Hold `size` bytes of the bound and one call while the block runs (the bytes longer, if the
        block hands them over: until Admitted.release); Overloaded when they do not fit, or would wait
        longer than `target_ms` or a third of the caller's `deadline_s` (its time left)."""
        target_ms = self.target_ms if deadline_s is None else min(self.target_ms, deadline_s * 1000 / 3)
        with self._lock:
            now = self._clock()
            pace = self._pace(now)  # bytes stored per second lately; None: unknown
            if self._calls:
                wait_ms = None if pace is None else (self._bytes + size) / pace * 1000
                if (
                    wait_ms is not None
                    and self._back_by <= now
                    and (self._mean_took_ms() <= target_ms / 2 or self._finished_bytes < size)
                ):
                    # the store keeps up, or its pace was measured on fewer bytes than this write's (a
                    # write costs the store mostly per insert: run descriptions of a few hundred bytes
                    # finishing slowly under load foretold 2,700 s for a 1.8 MB import chunk); and no
                    # writer turned away is yet to come back
                    wait_ms = None
                max_calls = self.max_calls if pace else min(self.max_calls, FIRST_CALLS)
                if (
                    self._bytes + size > self.max_bytes
                    or self._calls >= max_calls
                    or (wait_ms is not None and wait_ms > target_ms)
                ):
                    self._refused += 1
                    retry_ms = self._retry_ms(size, pace, now, target_ms)
                    raise Overloaded(
                        f"{BEHIND}: {self._bytes} bytes of {self._calls} writes wait to be stored"
                        + (f", about {wait_ms / 1000:.1f} s of work" if wait_ms is not None else "")
                        + f"; the limits are {self.max_bytes} bytes (--max-pending-bytes), {max_calls} "
                        f"writes and {target_ms / 1000:g} s (--ack-target-ms, or a third of the call's deadline); "
                        f"retry in {retry_ms} ms",
                        retry_ms,
                    )
            self._bytes += size
            self._calls += 1
            self._admitted += 1
            self._peak = max(self._peak, self._bytes)
        admitted = Admitted(self, size, self._clock())
        try:
            yield admitted
        finally:
            with self._lock:
                self._calls -= 1
            if not admitted.handed_over:
                admitted.release()

    def _stored(self, size: int, took: float) -> None:
        with self._lock:
            self._bytes -= size
            now = self._clock()
            if not self._finished:
                self._first_finished = now
            self._finished.append((now, size, took))
            self._finished_bytes += size
            self._finished_took += took

    def _pace(self, now: float) -> float | None:
        while self._finished and self._finished[0][0] < now - PACE_WINDOW_S:
            _, size, took = self._finished.popleft()
            self._finished_bytes -= size
            self._finished_took -= took
        if not self._finished:
            self._finished_bytes, self._finished_took = 0, 0.0  # no drift of the float sum past an idle spell
        if self._finished_bytes <= 0:  # none lately, or only empty writes: no pace to tell
            return None
        # over the whole window once writes have finished for that long; never under a second,
        # since the writes of a group commit finish together
        span = min(PACE_WINDOW_S, max(1.0, now - self._first_finished))
        return self._finished_bytes / span

    def _mean_took_ms(self) -> float:
        return self._finished_took / max(1, len(self._finished)) * 1000

    def _retry_ms(self, size: int, pace: float | None, now: float, target_ms: float) -> int:
        """This write's turn: once it would fit at the recent pace, and after the turns of the writes
        turned away before it, each as long as the store takes to store it at that pace; so that the
        writers turned away come back one after another at the pace the store takes them, not all at
        once, and each call finds room. MAX_RETRY_MS for a write turned away from a crowd."""
        self._refusals.append(now)
        while self._refusals[0] < now - PACE_WINDOW_S:
            self._refusals.popleft()
        if len(self._refusals) > self.max_calls:  # a crowd, not a burst
            return self._crowd_pause_ms(size, pace, now)
        if pace is None:  # as long as a write is taken to last at first, times how far over the bounds
            over = max((self._bytes + size) / self.max_bytes, (self._calls + 1) / min(self.max_calls, FIRST_CALLS))
            return int(min(MAX_RETRY_MS, FIRST_WRITE_MS * over))
        fits = now + max(MIN_RETRY_MS, (self._bytes + size) / pace * 1000 - target_ms / 2) / 1000
        latest = now + MAX_RETRY_MS / 1000  # at a pace measured on a few writes, turns would run far ahead
        turn = min(max(self._next_turn, fits), latest)
        self._next_turn = min(turn + size / pace, latest)
        self._back_by = max(self._back_by, turn)
        return int((turn - now) * 1000)

    def _crowd_pause_ms(self, size: int, pace: float | None, now: float) -> int:
        """How long a writer turned away from a crowd stays away: until the store has taken, at the recent
        pace, the writes in flight, what the writers turned away before it bring back, and its own write;
        at least MIN_CROWD_MS (also while the pace is unknown), at most MAX_RETRY_MS."""
        while self._away and self._away[0][0] <= now:
            self._away_bytes -= heapq.heappop(self._away)[1]
        pause_s = MIN_CROWD_MS / 1000
        if pace is not None:
            pause_s = min(MAX_RETRY_MS / 1000, max(pause_s, (self._away_bytes + self._bytes + size) / pace))
        heapq.heappush(self._away, (now + pause_s, size))
        self._away_bytes += size
        self._back_by = max(self._back_by, now + pause_s)
        return round(pause_s * 1000)

    def turning_away(self) -> bool:
        """Whether writes were refused over the last PACE_WINDOW_S, or writers turned away are yet to
        come back: the store is behind, and the writes it takes are answered once claimed."""
        with self._lock:
            now = self._clock()
            return self._back_by > now or bool(self._refusals and self._refusals[-1] >= now - PACE_WINDOW_S)

    def counts(self) -> AdmissionCounts:
        with self._lock:
            return AdmissionCounts(self._bytes, self._calls, self._peak, self._admitted, self._refused)
