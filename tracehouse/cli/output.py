"""Print a DataFrame as a table (for people), JSON or CSV (for programs).

A table reads as a person reads it (tracehouse.readable): human units, blank where a value is missing,
headers in words, unique short names, numbers right-aligned; internal ids and wide maps (attrs, extras)
only with `wide`, which also prints names whole; control and bidi characters escaped (`\\u202e`), so that
no name reorders or hides what is around it. JSON and CSV keep every value exact: times and durations as
integer ns, sizes as bytes, text as it is. A value that is not UTF-8 text reads as its bytes escaped (`\\xff`)
in every format (tracehouse.readable.bytes_text).
"""

from __future__ import annotations

import json
import sys
from datetime import date, time
from decimal import Decimal
from typing import Any, TextIO
from uuid import UUID

import numpy as np
import pandas as pd

from tracehouse.readable import NAME_COLUMNS, OPAQUE_IDS, bytes_text, column_kind, readable

FORMATS = ("table", "json", "csv")
WIDE_ONLY = ("attrs", "extras", "top_kernels_full")  # maps of any width, full names: in --wide, JSON and CSV
NARROW_ONLY = ("top_kernels",)  # short names with a full twin: tables without --wide
UNCUT = ("top_kernels",)  # short names already, each with its share: cut, they would lose the share
MAX_CELL = 48  # other text cut to this in a table (names get unique short forms instead)


def _time_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if isinstance(frame[c].dtype, pd.DatetimeTZDtype)]


def _as_ns(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    for column in [c for c in out.columns if pd.api.types.is_timedelta64_dtype(out[c].dtype)]:  # intervals: ns
        out[column] = pd.array([None if pd.isna(v) else int(v.value) for v in out[column]], dtype="Int64")
    for column in _time_columns(out):
        values = out[column]
        out[column] = (
            pd.array([None if pd.isna(v) else int(v.value) for v in values], dtype="Int64")
            if values.isna().any()
            else values.astype("int64")
        )
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return None if np.isnan(value) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return bytes_text(value)
    if isinstance(value, Decimal):  # exact: an integer as a number, a fraction as its decimal text
        return int(value) if value == value.to_integral_value() else str(value)
    if isinstance(value, UUID | date | time):
        return str(value)
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and np.isnan(value):
        return None
    return value


def _cell(text: str, cut: bool) -> str:
    return text[: MAX_CELL - 1] + "…" if cut and len(text) > MAX_CELL else text


def _right_aligned(frame: pd.DataFrame, column: str) -> bool:
    values = frame[column]
    if pd.api.types.is_bool_dtype(values.dtype):
        return False
    return pd.api.types.is_numeric_dtype(values.dtype) or column_kind(column, values) not in ("text", "instant")


def table_text(frame: pd.DataFrame, wide: bool = False) -> str:
    """The frame as lines of text for a terminal: two spaces between columns, numbers right-aligned."""
    if frame.empty:
        return "(no rows)\n"
    hide = NARROW_ONLY if wide else (*OPAQUE_IDS, *WIDE_ONLY)
    kept = [str(c) for c in frame.columns if c not in hide]
    shown = readable(frame, name_width=None, hide=hide) if wide else readable(frame, hide=hide)
    cuts = [not wide and c not in (*NAME_COLUMNS, *UNCUT) and column_kind(c, frame[c]) == "text" for c in kept]
    columns = [
        [header, *(_cell(str(v), cut) for v in shown[header])] for header, cut in zip(shown.columns, cuts, strict=True)
    ]
    widths = [max(len(cell) for cell in column) for column in columns]
    right = [_right_aligned(frame, c) for c in kept]
    rows = zip(*columns, strict=True)
    lines = [
        "  ".join(
            cell.rjust(width) if align else cell.ljust(width)
            for cell, width, align in zip(row, widths, right, strict=True)
        ).rstrip()
        for row in rows
    ]
    return "\n".join(lines) + "\n"


def json_document(frames: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """Several tables as one JSON object of arrays of rows, exact ns and bytes."""
    return {
        name: [{k: _jsonable(v) for k, v in row.items()} for row in _as_ns(frame).to_dict(orient="records")]
        for name, frame in frames.items()
    }


def render_many(frames: dict[str, pd.DataFrame], fmt: str, out: TextIO | None = None, wide: bool = False) -> None:
    """Several tables: one JSON object of arrays, or each table under a `# name` line."""
    out = out or sys.stdout
    if fmt == "json":
        json.dump(json_document(frames), out)
        out.write("\n")
        return
    for number, (name, frame) in enumerate(frames.items()):
        out.write(("\n" if number else "") + f"# {name}\n")
        render(frame, fmt, out, wide)


def render(frame: pd.DataFrame, fmt: str, out: TextIO | None = None, wide: bool = False) -> None:
    out = out or sys.stdout
    if fmt == "json":
        records = _as_ns(frame).to_dict(orient="records")
        json.dump([{k: _jsonable(v) for k, v in row.items()} for row in records], out)
        out.write("\n")
    elif fmt == "csv":
        exact = _as_ns(frame)
        for column in exact.columns:
            if pd.api.types.is_object_dtype(exact[column].dtype):
                exact[column] = exact[column].map(lambda v: bytes_text(v) if isinstance(v, bytes) else v)
        exact.to_csv(out, index=False)
    elif fmt == "table":
        out.write(table_text(frame, wide))
    else:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
