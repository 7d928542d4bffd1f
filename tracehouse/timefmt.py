"""Time as integer nanoseconds since the Unix epoch, UTC: parsing and printing."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

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
