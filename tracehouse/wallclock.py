"""Answers about a run without a wall clock (relative_time: nsys exports before 2021.3, Kineto traces
without baseTimeNanoseconds), as people read them: every instant an offset from the run's start
('+3.362 s', tracehouse.timefmt.format_instant), never a 1970 date. Pure: DataFrames in, DataFrames out.

Only tables for people go through here; JSON and CSV keep exact ns integers.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from tracehouse.readable import column_kind, header, run_starts
from tracehouse.timefmt import format_instant


def ns_of(value: Any) -> int | None:
    """An instant as ns since the origin (an integer, or a Timestamp as the client answers times); None
    when missing."""
    if value is None or value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, pd.Timestamp):
        return int(value.value)
    if isinstance(value, float) and value != value:
        return None
    return int(value)


def run_clock(runs: pd.DataFrame, run: str) -> tuple[bool, int]:
    """(whether it has a wall clock, its start in ns) of the run `run` names, by its id, else by its name
    when one run of `runs` (the Query client's runs answer) has it; (True, 0) when none or several do,
    as the Query service then answers with dates or a refusal."""
    if not run or runs.empty:
        return True, 0
    found = runs[runs["run_id"] == run]
    if found.empty:
        found = runs[runs["name"] == run]
    if len(found) != 1:
        return True, 0
    row = found.iloc[0]
    return not bool(row["relative_time"]), ns_of(row["start"]) or 0


def as_offsets(frame: pd.DataFrame, origin_ns: int = 0) -> pd.DataFrame:
    """`frame` for a table, its instant columns (tracehouse.readable.column_kind) as offsets from
    `origin_ns` under their header for people (so that the table prints them as the text they are)."""
    shown = frame.copy()
    names: dict[str, str] = {}
    for column in frame.columns:
        kind = column_kind(str(column), frame[column])
        if kind != "instant":
            continue
        cells = [ns_of(value) for value in frame[column]]
        shown[column] = ["" if ns is None else format_instant(ns, False, origin_ns) for ns in cells]
        title = header(str(column), kind)
        names[str(column)] = title if title not in frame.columns else str(column)
    return shown.rename(columns=names)


def starts_without_wall_clock(frame: pd.DataFrame, relative: dict[str, bool], column: str = "start") -> pd.DataFrame:
    """`frame` (one row per run, with `run_id`) with `column` as text for people: the date where the run has a
    wall clock, 'no wall clock' where `relative` says it has none; unchanged when no row is relative."""
    if column not in frame.columns or not any(relative.get(str(run), False) for run in frame["run_id"]):
        return frame
    shown = frame.copy()
    clockless = [
        relative.get(str(run), False) or ns_of(value) is None
        for run, value in zip(frame["run_id"], frame[column], strict=True)
    ]
    shown[column] = run_starts(frame[column], pd.Series(clockless, dtype=bool))
    return shown
