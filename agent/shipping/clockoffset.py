"""The host's clock offset to the server, measured NTP's way from the agent's writes.

Each answered Write gives four instants: the host's wall clock when the call went out (t1) and when the
answer came (t4 = t1 + the round trip, timed on the monotonic clock), the server's wall clock when the
call reached it (t2) and when it answered (t3). The server's clock less the host's is then
((t2 - t1) + (t3 - t4)) / 2, within half the time the call spent on the wire, ((t4 - t1) - (t3 - t2)) / 2,
whatever the two directions took each (RFC 5905). Of a window's measurements the one of the least
uncertainty is the estimate: the others were delayed on the way, one way more than the other.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

WINDOW_NS = 60 * 10**9  # measurements older than this are forgotten (a wall clock that was set moves on)
WINDOW_WRITES = 64


@dataclass(frozen=True)
class Measurement:
    offset_ns: int  # the server's wall clock less the host's
    uncertainty_ns: int  # the true offset is within offset_ns ± uncertainty_ns
    at_ns: int  # when it was measured, on the monotonic clock


def measure(
    sent_ns: int, round_trip_ns: int, server_received_ns: int, server_time_ns: int, at_ns: int
) -> Measurement | None:
    """The offset one Write gives: sent on the host's wall clock, its round trip on the monotonic clock,
    the server's two instants from its answer (0: a server that does not say, so None)."""
    held = server_time_ns - server_received_ns
    if server_received_ns <= 0 or server_time_ns <= 0 or not 0 <= held <= round_trip_ns:
        return None  # a server that does not say, or a clock set during the call
    answered_ns = sent_ns + round_trip_ns
    offset2 = (server_received_ns - sent_ns) + (server_time_ns - answered_ns)
    return Measurement(offset2 // 2, -(-(round_trip_ns - held) // 2), at_ns)


def best(measurements: Iterable[Measurement]) -> Measurement | None:
    """The measurement of the least uncertainty, the latest of equals."""
    chosen = None
    for measurement in measurements:
        if chosen is None or measurement.uncertainty_ns <= chosen.uncertainty_ns:
            chosen = measurement
    return chosen


def recent(measurements: Iterable[Measurement], now_ns: int, window_ns: int = WINDOW_NS) -> list[Measurement]:
    return [m for m in measurements if now_ns - m.at_ns <= window_ns]


class ClockOffset:
    """The measurements of the last WINDOW_NS (WINDOW_WRITES at most), added by the shipper's thread and
    taken by the sampler's: `fresh` gives the estimate once per new measurement."""

    def __init__(self, window_ns: int = WINDOW_NS, writes: int = WINDOW_WRITES) -> None:
        self._window_ns = window_ns
        self._kept: deque[Measurement] = deque(maxlen=writes)
        self._new = False
        self._lock = threading.Lock()

    def add(self, measurement: Measurement | None) -> None:
        if measurement is None:
            return
        with self._lock:
            self._kept.append(measurement)
            self._new = True

    def estimate(self, now_ns: int) -> Measurement | None:
        with self._lock:
            return best(recent(self._kept, now_ns, self._window_ns))

    def fresh(self, now_ns: int) -> Measurement | None:
        """The estimate when a write was measured since the last call, else None."""
        with self._lock:
            if not self._new:
                return None
            self._new = False
            return best(recent(self._kept, now_ns, self._window_ns))
