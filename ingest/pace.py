"""A pace per caller: token buckets by key (a capture request's caller and run), `burst` at once and then
`per_minute`; a key whose bucket is empty is told how long to wait. Only the most recently used
MAX_KEYS keys are kept: one forgotten starts full again, as one not seen for a while would be."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable

MAX_KEYS = 10_000


class Pace:
    def __init__(self, burst: int, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        if burst < 1 or not per_minute > 0:
            raise ValueError(f"a pace of {burst} at once and {per_minute:g} a minute lets nothing through")
        self.burst = burst
        self.per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: collections.OrderedDict[Hashable, tuple[float, float]] = collections.OrderedDict()

    def take(self, key: Hashable) -> float:
        """0 once `key` took one; else the seconds until it may."""
        rate = self.per_minute / 60
        with self._lock:
            now = self._clock()
            left, at = self._buckets.pop(key, (float(self.burst), now))
            left = min(float(self.burst), left + (now - at) * rate)
            wait = 0.0 if left >= 1 else (1 - left) / rate
            self._buckets[key] = (left - 1 if not wait else left, now)
            if len(self._buckets) > MAX_KEYS:
                self._buckets.popitem(last=False)
        return wait
