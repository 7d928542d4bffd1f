"""A query answer as a person reads it: each column's unit told by its name (`total_ns`, `busy_pct`,
`gpu_mem_peak_bytes`, datetime columns), its cells in human units, missing values blank, headers in
words with the unit where one unit holds for the column. Pure: DataFrames in, text out.

The answer itself is never changed: programs read exact ns and bytes from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pandas as pd

from tracehouse import units
from tracehouse.model import SUM_CAP_NS
from tracehouse.shortnames import DEFAULT_WIDTH, unique_short_names

Formatter = Callable[[Any], str]

OPAQUE_IDS = ("id", "range_id")  # internal keys: for programs, not for people
COUNTS = {"instances", "kernels", "events", "samples", "islands", "gpu_ops", "count", "calls", "rows",
          "with_gpu_work", "points", "sm_count", "api_calls", "short", "syncs", "gaps", "gaps_after_sync",
          "ranges", "values", "kernel_ops"}  # fmt: skip
NAME_COLUMNS = ("name", "top_name", "kernel", "range", "phase")
METRIC_VALUES = ("min", "avg", "max", "value", "mean", "p50", "p95", "p99")
WORDS = {"avg": "avg", "med": "median", "min": "min", "max": "max", "stddev": "std dev", "pct": "%",
         "delta": "Δ", "p90": "p90", "p95": "p95", "p99": "p99", "gpu": "GPU", "sm": "SM", "mem": "mem",
         "util": "util", "a": "A", "b": "B", "nvtx": "NVTX", "api": "API", "pid": "pid", "tid": "tid"}  # fmt: skip
UNIT_TOKENS = {"ns", "bytes", "s", "j", "w", "mhz", "c"}


# what a person must never read raw: control characters (C0, DEL, C1), the line and paragraph separators,
# and the bidi controls that reorder what is shown around them (U+202E writes the rest right to left)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def for_people(text: str) -> str:
    """Text as a person reads it safely: one line, in the order it was written, its control and bidi
    characters escaped (`\\n`, `\\x1b`, `\\u202e`). Every table for people shows text through this."""
    return _UNSAFE.sub(_escape, text)


def bytes_text(data: bytes) -> str:
    """A value that is not UTF-8 text (SQL's unhex, say), shown as its bytes in every format: printable
    ASCII as it is, a backslash doubled, every other byte escaped (`\\xff`)."""
    return "".join("\\\\" if byte == 0x5C else chr(byte) if 0x20 <= byte < 0x7F else f"\\x{byte:02x}" for byte in data)


def column_kind(name: str, values: pd.Series | None = None) -> str:
    """One of instant, duration, seconds, size, rate, percent, energy, power, clock, count, index (a GPU or
    stream: -1 is none), text, number. The type decides first (a time, an interval, the decimal seconds of
    `end - start` of two DateTime64(9)), then the name: a column of ns durations is read as one where its
    type or its name says so (an `ns` word: total_ns); a plain integer named otherwise stays a number."""
    if values is not None and pd.api.types.is_datetime64_any_dtype(values.dtype):
        return "instant"
    if values is not None and pd.api.types.is_timedelta64_dtype(values.dtype):
        return "duration"
    if values is not None and _ns_decimals(values):
        return "seconds"
    tokens = name.lower().split("_")
    if "ns" in tokens:
        moments = {"start", "end", "first", "last", "ts", "at"}
        return "instant" if moments & set(tokens) and "delta" not in tokens else "duration"
    if "bytes" in tokens:
        return "rate" if "per" in tokens else "size"
    if name == "memory_total" or name == "bytes":
        return "size"
    if "pct" in tokens or name.endswith("%") or {"util", "active"} & set(tokens):
        return "percent"
    if tokens[-1] == "s" or tokens[-2:-1] == ["s"]:
        return "seconds"
    if "j" in tokens:
        return "energy"
    if "w" in tokens:
        return "power"
    if "mhz" in tokens:
        return "clock"
    if name in COUNTS or (name[:-2] in COUNTS and name[-2:] in ("_a", "_b")):  # diff's instances_a
        return "count"
    if name in ("gpu", "stream"):
        return "index"
    if values is not None and pd.api.types.is_float_dtype(values.dtype):
        return "number"
    return "text"


def _ns_decimals(values: pd.Series) -> bool:
    """Decimals of 9 places (seconds to the ns): what the engine makes of DateTime64(9) - DateTime64(9)."""
    if not pd.api.types.is_object_dtype(values.dtype):
        return False
    present = [v for v in values.head(100) if not units.missing(v)]
    return bool(present) and all(isinstance(v, Decimal) and v.as_tuple().exponent == -9 for v in present)


def header(name: str, kind: str) -> str:
    """`total_ns` -> 'total', `time_pct` -> 'time %', `avg_ns_a` -> 'avg A', `gpu_mem_peak_bytes` -> 'GPU mem peak'."""
    words = [WORDS.get(token, token) for token in name.split("_") if token.lower() not in UNIT_TOKENS]
    if kind == "percent" and "%" not in words:
        words.append("%")
    if kind == "rate" and words[-2:] == ["per", "s"]:
        words = words[:-2]
    elif kind == "rate" and words[-1:] == ["per"]:  # algbw_bytes_per_s: the unit went with the tokens
        words = words[:-1]
    return " ".join(word for word in words if word) or name


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return for_people(", ".join(f"{k}={v}" for k, v in sorted(value.items())))
    if isinstance(value, list | tuple):
        return for_people(", ".join(str(v) for v in value))
    if isinstance(value, bytes):
        return bytes_text(value)
    if units.missing(value):
        return ""
    if isinstance(value, float):
        return units.significant(value, 4)
    return for_people(str(value))


def _duration(value: Any) -> str:
    """A duration; a sum at the cap reads as at least it."""
    if isinstance(value, pd.Timedelta):
        value = value.value
    text = units.duration(value)
    if units.missing(value) or abs(float(value)) < SUM_CAP_NS:
        return text
    return f"≥ {text}" if float(value) > 0 else f"≤ {text}"


def _instant(origin_ns: int | None) -> Formatter:
    def show(value: Any) -> str:
        if units.missing(value):
            return ""
        ns = int(value.value) if isinstance(value, pd.Timestamp) else int(value)
        return units.offset(ns - origin_ns) if origin_ns is not None else units.instant(ns)

    return show


def formatter(kind: str, origin_ns: int | None = None) -> Formatter:
    """How one cell of a column of `kind` reads."""
    simple: dict[str, Formatter] = {
        "duration": _duration,
        "seconds": units.seconds,
        "size": units.size,
        "rate": units.rate,
        "percent": units.percent,
        "energy": lambda v: units.number(v, "J"),
        "power": lambda v: units.number(v, "W"),
        "clock": lambda v: units.number(v, "MHz"),
        "count": units.count,
        "index": lambda v: "" if units.missing(v) or int(v) < 0 else str(int(v)),  # -1: none (a host event)
        "number": lambda v: "" if units.missing(v) else units.significant(float(v), 4),
    }
    if kind == "instant":
        return _instant(origin_ns)
    return simple.get(kind, _plain)


def formatters(frame: pd.DataFrame, origin_ns: int | None = None) -> dict[str, Formatter]:
    """Each column's cell formatter (for pandas' Styler.format, keyed by the answer's column names)."""
    return {str(c): formatter(column_kind(str(c), frame[c]), origin_ns) for c in frame.columns}


def headers(frame: pd.DataFrame) -> dict[str, str]:
    """Each column's header for people; distinct, as the answer's names are."""
    texts = {str(c): for_people(header(str(c), column_kind(str(c), frame[c]))) for c in frame.columns}
    clashing = {text for text in texts.values() if list(texts.values()).count(text) > 1}
    return {column: column if text in clashing else text for column, text in texts.items()}


def _metric_cells(frame: pd.DataFrame, column: str) -> list[str]:
    return [units.metric_value(str(m), v) for m, v in zip(frame["metric"], frame[column], strict=True)]


def readable(
    frame: pd.DataFrame,
    *,
    origin_ns: int | None = None,
    name_width: int | None = DEFAULT_WIDTH,
    hide: tuple[str, ...] = OPAQUE_IDS,
) -> pd.DataFrame:
    """The answer as text for people: human units, unique short names (`name_width` None: whole),
    times from `origin_ns` where given (else absolute), internal ids left out."""
    shown = frame.drop(columns=[c for c in hide if c in frame.columns])
    cells: dict[str, list[str]] = {}
    for column, show in formatters(shown, origin_ns).items():
        if "metric" in shown.columns and column in METRIC_VALUES:
            cells[column] = _metric_cells(shown, column)
        elif column in NAME_COLUMNS and name_width is not None:
            labels = unique_short_names([str(v) for v in shown[column] if isinstance(v, str)], name_width)
            cells[column] = [for_people(labels[v]) if isinstance(v, str) else _plain(v) for v in shown[column]]
        else:
            cells[column] = [show(v) for v in shown[column]]
    names = headers(shown)
    return pd.DataFrame({names[c]: cells[c] for c in cells}, index=shown.index)


NO_WALL_CLOCK = "no wall clock"  # a trace whose times count from its own start (old nsys exports)


def run_starts(starts: pd.Series, relative: pd.Series) -> list[str]:
    """When runs started, as people read it: a run without a wall clock says so rather than 1970."""
    return [NO_WALL_CLOCK if bool(rel) else _instant(None)(start) for start, rel in zip(starts, relative, strict=True)]
