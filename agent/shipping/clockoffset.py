"""The host's clock offset to the server, measured NTP's way from the agent's writes.

Each answered Write gives four instants: the host's wall clock when the call went out (t1) and when the
answer came (t4 = t1 + the round trip, timed on the monotonic clock), the server's wall clock when the
call reached it (t2) and when it answered (t3). The server's clock less the host's is then
((t2 - t1) + (t3 - t4)) / 2, within half the time the call spent on the wire, ((t4 - t1) - (t3 - t2)) / 2,
whatever the two directions took each (RFC 5905).

A measurement is carried to a later instant on the monotonic clock, which no one sets: a wall clock set
since (a step in the host's wall clock less its monotonic clock) moves the offset by as much, and the
uncertainty grows by DRIFT_PPM of the time gone by (NTP's dispersion: how far two clocks' rates may part).
The estimate is the measurement of the last WINDOW_NS that is least uncertain now.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

WINDOW_NS = 60 * 10**9  # measurements older than this are forgotten
WINDOW_WRITES = 64
DRIFT_PPM = 15  # NTP's PHI: 15 µs a second


@dataclass(frozen=True)
class Measurement:
    offset_ns: int  # the server's wall clock less the host's
    uncertainty_ns: int  # the true offset is within offset_ns ± uncertainty_ns
    at_ns: int  # when, on the host's monotonic clock
    wall_minus_monotonic_ns: int = 0  # the host's wall clock less its monotonic clock then


def measure(
    sent_ns: int, started_ns: int, answered_ns: int, server_received_ns: int, server_time_ns: int
) -> Measurement | None:
    """The offset one Write gives: sent at `sent_ns` on the host's wall clock, at `started_ns` and answered
    at `answered_ns` on its monotonic clock, and the server's two instants from its answer (0: a server
    that does not say, so None)."""
    round_trip = answered_ns - started_ns
    held = server_time_ns - server_received_ns
    if server_received_ns <= 0 or server_time_ns <= 0 or not 0 <= held <= round_trip:
        return None  # a server that does not say, or a clock set during the call
    offset2 = (server_received_ns - sent_ns) + (server_time_ns - (sent_ns + round_trip))
    return Measurement(offset2 // 2, -(-(round_trip - held) // 2), answered_ns, sent_ns - started_ns)


def carried(measurement: Measurement, at_ns: int, wall_minus_monotonic_ns: int) -> Measurement:
    """`measurement` as of `at_ns` on the monotonic clock, when the wall clock less it is `wall_minus_monotonic_ns`."""
    stepped = wall_minus_monotonic_ns - measurement.wall_minus_monotonic_ns
    grown = -(-max(0, at_ns - measurement.at_ns) * DRIFT_PPM // 1_000_000)
    return Measurement(
        measurement.offset_ns - stepped, measurement.uncertainty_ns + grown, at_ns, wall_minus_monotonic_ns
    )


def best(
    measurements: Iterable[Measurement], at_ns: int, wall_minus_monotonic_ns: int, window_ns: int = WINDOW_NS
) -> Measurement | None:
    """Of the measurements of the window before `at_ns`, the least uncertain carried to then (the latest of equals)."""
    chosen = None
    for measurement in measurements:
        if at_ns - measurement.at_ns > window_ns:
            continue
        now = carried(measurement, at_ns, wall_minus_monotonic_ns)
        if chosen is None or now.uncertainty_ns <= chosen.uncertainty_ns:
            chosen = now
    return chosen


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

    def estimate(self, at_ns: int, wall_minus_monotonic_ns: int) -> Measurement | None:
        with self._lock:
            return best(self._kept, at_ns, wall_minus_monotonic_ns, self._window_ns)

    def fresh(self, at_ns: int, wall_minus_monotonic_ns: int) -> Measurement | None:
        """The estimate when a write was measured since the last call, else None."""
        with self._lock:
            if not self._new:
                return None
            self._new = False
            return best(self._kept, at_ns, wall_minus_monotonic_ns, self._window_ns)
