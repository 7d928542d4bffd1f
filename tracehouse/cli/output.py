"""Print a DataFrame as a table (for people), JSON or CSV (for programs).

In table output times are ISO-8601 (UTC, ns); in JSON and CSV they are integer ns since
the epoch, so nothing is rounded.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import numpy as np
import pandas as pd

from tracehouse.timefmt import format_ns

FORMATS = ("table", "json", "csv")
MAX_CELL = 80


def _time_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if isinstance(frame[c].dtype, pd.DatetimeTZDtype)]


def _as_ns(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
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
        return value.decode("utf-8", "replace")
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and np.isnan(value):
        return None
    return value


def _cell(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def render_many(frames: dict[str, pd.DataFrame], fmt: str, out: TextIO | None = None) -> None:
    """Several tables: one JSON object of arrays, or each table under a `# name` line."""
    out = out or sys.stdout
    if fmt == "json":
        document = {
            name: [{k: _jsonable(v) for k, v in row.items()} for row in _as_ns(frame).to_dict(orient="records")]
            for name, frame in frames.items()
        }
        json.dump(document, out)
        out.write("\n")
        return
    for number, (name, frame) in enumerate(frames.items()):
        out.write(("\n" if number else "") + f"# {name}\n")
        render(frame, fmt, out)


def render(frame: pd.DataFrame, fmt: str, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        records = _as_ns(frame).to_dict(orient="records")
        json.dump([{k: _jsonable(v) for k, v in row.items()} for row in records], out)
        out.write("\n")
    elif fmt == "csv":
        _as_ns(frame).to_csv(out, index=False)
    elif fmt == "table":
        if frame.empty:
            out.write("(no rows)\n")
            return
        shown = frame.copy()
        for column in _time_columns(shown):
            shown[column] = [("" if pd.isna(v) else format_ns(int(v.value))) for v in shown[column]]
        shown = shown.map(_cell)
        out.write(shown.to_string(index=False) + "\n")
    else:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
