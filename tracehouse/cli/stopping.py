"""The main thread's wait for a stop that a signal's handler asks for."""

from __future__ import annotations

import threading
import time

SIGNAL_POLL_S = 0.5


def wait_for_stop(stop: threading.Event, seconds: float | None = None) -> bool:
    """Wait until `stop` is set or `seconds` have passed (None: no limit); True once it is set. The wait
    is made in slices: the kernel hands a process's signal to any of its threads (gRPC's, the engine's,
    the agent's), and Python runs the handler in the main thread only once that thread wakes, which an
    untimed wait never does."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        left = SIGNAL_POLL_S if deadline is None else min(SIGNAL_POLL_S, deadline - time.monotonic())
        if left <= 0:
            return stop.is_set()
        if stop.wait(left):
            return True
