"""A fixed-rate schedule that does not drift: tick k is due at start + k * interval."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def run_fixed_rate(
    interval: float,
    stop: threading.Event,
    tick: Callable[[int], None],
    monotonic: Callable[[], float] = time.monotonic,
    wait: Callable[[float], bool] | None = None,
) -> None:
    """Call tick(missed) at every due time until stop is set. When ticks overrun, the
    latest overdue tick runs at once and the older ones are skipped and counted in
    `missed`, rather than run in a burst. `wait(seconds)` returns True when stopped."""
    wait = wait or stop.wait
    start = monotonic()
    due = 0
    missed = 0
    while not stop.is_set():
        tick(missed)
        due += 1
        late = monotonic() - (start + due * interval)
        missed = int(late // interval) if late >= interval else 0
        due += missed
        if wait(max(0.0, start + due * interval - monotonic())):
            return
