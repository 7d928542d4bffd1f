"""Time as integer nanoseconds since the Unix epoch, UTC: parsing and printing."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from tracehouse import units

NS_PER_S = 1_000_000_000

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": NS_PER_S,
    "m": 60 * NS_PER_S,
    "min": 60 * NS_PER_S,
    "h": 3600 * NS_PER_S,
    "d": 86400 * NS_PER_S,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|min|m|h|d)\s*$")
_RELATIVE = re.compile(r"^\s*now\s*(?:([-+])\s*(.+))?$|^\s*-\s*(.+)$")
_FRACTION = re.compile(r"\.(\d+)")


def now_ns() -> int:
    return time.time_ns()


def parse_duration(text: str) -> int:
    """'1.5s', '250ms', '10m', '2h' -> nanoseconds. Raises ValueError naming the text."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (a number followed by ns, us, ms, s, m, h or d)")
    number, unit = match.groups()
    whole, _, frac = number.partition(".")
    scale = _UNITS_NS[unit]
    return int(whole) * scale + (int(frac) * scale // 10 ** len(frac) if frac else 0)


def parse_time(text: str, now: int | None = None) -> int:
    """An instant as ns since the epoch, from any of:

    - an integer: ns since the epoch;
    - ISO-8601 (`2026-11-29T14:02:00Z`, `2026-11-29 14:02:00.123456789+01:00`); no zone means UTC;
    - `now`, `now-5m`, `now+1h`, or `-5m` (relative to now).
    """
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    relative = _RELATIVE.match(text)
    if relative:
        base = now_ns() if now is None else now
        sign, amount, bare = relative.groups()
        if bare is not None:
            return base - parse_duration(bare)
        if amount is None:
            return base
        delta = parse_duration(amount)
        return base + delta if sign == "+" else base - delta
    return _parse_iso(text)


def _parse_iso(text: str) -> int:
    # datetime keeps microseconds; take the fraction apart to keep nanoseconds.
    fraction_ns = 0
    match = _FRACTION.search(text)
    if match and re.search(r"\d:\d\d\.\d", text):
        digits = match.group(1)
        if len(digits) > 9:
            raise ValueError(f"{text!r}: more than 9 fractional digits")
        fraction_ns = int(digits.ljust(9, "0"))
        text = text[: match.start()] + text[match.end() :]
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use ISO-8601 (2026-11-29T14:02:00Z), ns since the epoch, or now-5m"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = int(moment.timestamp())
    return seconds * NS_PER_S + fraction_ns


def format_ns(ns: int) -> str:
    """ns since the epoch -> '2026-11-29T14:02:00.123456789Z' (exact)."""
    seconds, fraction = divmod(ns, NS_PER_S)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{fraction:09d}Z"


def format_duration(ns: int) -> str:
    for unit, scale in (("s", NS_PER_S), ("ms", 1_000_000), ("us", 1_000)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns} ns"


def format_offset(ns: int) -> str:
    """A time from a run's origin, for people, to three decimals of its unit: '+3.362 s', '+539.217 ms',
    '+12.500 µs', '+40 ns' ('-' before the origin)."""
    sign = "-" if ns < 0 else "+"
    size = abs(int(ns))
    for unit, scale in (("s", NS_PER_S), ("ms", 1_000_000), ("µs", 1_000)):
        if size >= scale:
            return f"{sign}{size / scale:.3f} {unit}"
    return f"{sign}{size} ns"


def format_instant(ns: int, wall_clock: bool = True, origin_ns: int = 0) -> str:
    """An instant as a person reads it, the one rule for every CLI table and explorer page: a UTC date to
    the millisecond ('2026-11-29 14:02:00.123 UTC') where the run has a wall clock, else (a trace whose
    times count from an unknown origin: relative_time, as nsys before 2021.3 wrote them) its offset from
    `origin_ns`, the run's start ('+3.362 s'), never a 1970 date. Programs read the ns themselves."""
    if not wall_clock:
        return format_offset(ns - origin_ns)
    return units.instant(ns)
