"""Instants of a run without a wall clock (old nsys exports count from their own start): offsets
from that start, `+3.362 s`, never a date in 1970."""

from __future__ import annotations

from tracehouse.timefmt import NS_PER_S


def clock_free(ns: int) -> str:
    """`+3.362 s`: to the millisecond from a second on, then ms and µs below (`+539.217 ms`)."""
    sign = "-" if ns < 0 else "+"
    size = abs(int(ns))
    if size == 0:
        return "+0 s"
    if size >= NS_PER_S:
        return f"{sign}{size / NS_PER_S:.3f} s"
    if size >= 1_000_000:
        return f"{sign}{size / 1_000_000:.3f} ms"
    if size >= 1_000:
        return f"{sign}{size / 1_000:.3f} µs"
    return f"{sign}{size} ns"
