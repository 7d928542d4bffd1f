"""Numbers as a person reads them: durations in adaptive units, sizes in KiB/MiB/GiB, rates
and readings with their unit, percentages with one decimal, missing values blank. Pure.

Programs get exact integers (ns, bytes) elsewhere; nothing here is meant to be parsed back.
"""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime

NS_PER_S = 1_000_000_000
_SUBSECOND = (("s", NS_PER_S), ("ms", 1_000_000), ("µs", 1_000))
_LONG = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))
_SIZES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_DECIMAL: tuple[tuple[float, str], ...] = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def missing(value: object) -> bool:
    """None, NaN, pandas' NA and NaT: shown blank."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN, NaT
    except (TypeError, ValueError):  # pandas.NA refuses bool()
        return True


def significant(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant figures, without trailing zeros: 4.80 -> '4.8', 1940 -> '1940'."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def duration(ns: float | None) -> str:
    """812 ns, 12.3 µs, 1.94 ms, 4.8 s, 2 min 03 s, 1 h 02 min, 3 d 04 h."""
    if missing(ns):
        return ""
    assert ns is not None
    sign = "-" if ns < 0 else ""
    size = abs(float(ns))
    if size < 1_000:
        return f"{sign}{significant(size)} ns" if size % 1 else f"{sign}{int(size)} ns"
    for unit, scale in _SUBSECOND[::-1]:  # the largest unit the value reaches once rounded
        shown = significant(size / scale)
        bigger = scale * 1000 if unit != "s" else 60 * NS_PER_S
        if size < bigger and float(shown) < (1000 if unit != "s" else 60):
            return f"{sign}{shown} {unit}"
    seconds = round(size / NS_PER_S)
    for (unit, scale), (small, small_scale) in itertools.pairwise(_LONG):
        if seconds >= scale:
            high, rest = divmod(seconds, scale)
            return f"{sign}{high:,} {unit} {rest // small_scale:02d} {small}"
    return f"{sign}{seconds} s"


def seconds(value: float | None) -> str:
    """A duration given in seconds."""
    return "" if missing(value) else duration(float(value) * NS_PER_S)  # type: ignore[arg-type]


def size(n_bytes: float | None) -> str:
    """512 B, 1.5 KiB, 71.9 GiB (binary units, as memory is sized)."""
    if missing(n_bytes):
        return ""
    assert n_bytes is not None
    sign = "-" if n_bytes < 0 else ""
    value = abs(float(n_bytes))
    if value < 1024:
        return f"{sign}{int(value)} B" if value % 1 == 0 else f"{sign}{significant(value)} B"
    power = min(int(math.log(value, 1024)), len(_SIZES) - 1)
    shown = significant(value / 1024**power)
    if float(shown) >= 1024 and power < len(_SIZES) - 1:
        power += 1
        shown = significant(value / 1024**power)
    return f"{sign}{shown} {_SIZES[power]}"


def rate(bytes_per_s: float | None) -> str:
    """1.2 GiB/s: a size each second."""
    return "" if missing(bytes_per_s) else size(bytes_per_s) + "/s"


def percent(value: float | None) -> str:
    """26.1 % (one decimal)."""
    return "" if missing(value) else f"{float(value):.1f} %"  # type: ignore[arg-type]


def count(value: float | None) -> str:
    """1,312: whole numbers with thousands separators."""
    if missing(value):
        return ""
    assert value is not None
    return f"{int(value):,}" if float(value).is_integer() else significant(float(value), 4)


def number(value: float | None, unit: str = "") -> str:
    """A reading with its unit, decimal prefixes past a thousand: 535 W, 41.7 kJ, 1410 MHz."""
    if missing(value):
        return ""
    assert value is not None
    value = float(value)
    prefix = ""
    if unit and unit not in ("MHz", "°C", "%"):
        for scale, name in _DECIMAL:
            if abs(value) >= scale:
                value, prefix = value / scale, name
                break
    text = significant(value, 4) if abs(value) < 10_000 else f"{value:,.0f}"
    return f"{text} {prefix}{unit}".rstrip()


def instant(ns: int | None) -> str:
    """An instant for people: 2026-11-29 14:02:00.123 UTC (to the millisecond)."""
    if missing(ns):
        return ""
    assert ns is not None
    whole, fraction = divmod(int(ns), NS_PER_S)
    stamp = datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp}.{fraction // 1_000_000:03d} UTC"


def offset(ns: int | None) -> str:
    """A time from a view's start, to the microsecond: +0 ns, +539.217 ms, +12.345678 s."""
    if missing(ns):
        return ""
    assert ns is not None
    sign = "-" if ns < 0 else "+"
    size = abs(int(ns))
    if size >= NS_PER_S:
        return f"{sign}{size / NS_PER_S:.6f} s"
    if size >= 1_000_000:
        return f"{sign}{size / 1_000_000:.3f} ms"
    if size >= 1_000:
        return f"{sign}{size / 1_000:.3f} µs"
    return f"{sign}{size} ns"


METRIC_UNITS = {  # the unit token that ends a metric's name, and how its values read
    "pct": "%",
    "bytes": "B",
    "bytes_per_s": "B/s",
    "w": "W",
    "j": "J",
    "c": "°C",
    "mhz": "MHz",
    "ns": "ns",
    "s": "s",
}


def metric_unit(metric: str) -> str:
    """gpu.util_pct -> '%', gpu.mem_used_bytes -> 'B', gpu.power_w -> 'W'; '' when the name has none."""
    name = metric.rsplit(".", 1)[-1].lower()
    for token, unit in sorted(METRIC_UNITS.items(), key=lambda item: -len(item[0])):
        if name.endswith("_" + token) or name == token:
            return unit
    return "%" if name.endswith("%]") or name.endswith("%") else ""


def metric_value(metric: str, value: float | None) -> str:
    """A reading of `metric` as a person reads it: 72.3 GiB, 98.0 %, 535 W, 41.7 kJ."""
    unit = metric_unit(metric)
    if unit == "%":
        return percent(value)
    if unit == "B":
        return size(value)
    if unit == "B/s":
        return rate(value)
    if unit == "ns":
        return duration(value)
    if unit == "s":
        return seconds(value)
    return number(value, unit)


def axis_scale(unit: str, largest: float) -> tuple[float, str]:
    """For an axis of values in `unit` up to `largest`: the divisor and the unit its ticks read in
    (ns up to 3e9 -> (1e9, 's'); bytes up to 8e10 -> (2**30, 'GiB'))."""
    largest = abs(largest) if math.isfinite(largest) else 0.0
    if unit == "ns":
        for name, scale in (*_SUBSECOND, ("ns", 1)):
            if largest >= scale:
                return float(scale), name
        return 1.0, "ns"
    if unit == "B":
        power = 0
        while power < len(_SIZES) - 1 and largest >= 1024 ** (power + 1):
            power += 1
        return float(1024**power), _SIZES[power]
    if unit == "B/s":
        divisor, label = axis_scale("B", largest)
        return divisor, label + "/s"
    if unit in ("W", "J"):
        for divisor, prefix in _DECIMAL:
            if largest >= divisor:
                return divisor, prefix + unit
    return 1.0, unit
