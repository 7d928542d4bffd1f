"""Compare's answer for people: one sentence (which run is faster and by how much, then the
biggest changes of its traced work) and the two runs' key figures, in human units. Pure: frames
in, text out.

`runs` is Client.compare((a, b)) (run A first), `changes` is Client.diff(a, b)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from tracehouse.model import SUM_CAP_NS
from tracehouse.readable import for_people
from tracehouse.shortnames import DEFAULT_WIDTH, unique_short_names
from tracehouse.units import count, duration, missing, number, percent, seconds, size

BIGGEST = 3  # changes named in the sentence
NAME_WIDTH = DEFAULT_WIDTH  # as every table and chart: the same kernel reads the same
SAME_PCT = 0.05  # durations closer than this (in %) read as equal: their rounded difference is 0.0 %
MINUS = "-"


def compare_headline(runs: pd.DataFrame, changes: pd.DataFrame) -> str:
    """'B is 14.7 % faster than A (38.1 s → 32.5 s). Biggest changes: x -4.8 s (-25.0 %), …'"""
    if len(runs) < 2:
        return ""
    a, b = runs.iloc[0], runs.iloc[1]
    names = _labels(a, b)
    return for_people(f"{_speed(a, b, *names)} {_biggest(changes)}".strip())


def _labels(a: pd.Series, b: pd.Series) -> tuple[str, str]:
    """Each run's name, or its id when it has none; with its id when both share one name."""
    label_a, label_b = (_text(run.get("name")) or str(run["run_id"]) for run in (a, b))
    if label_a == label_b:
        return f"{label_a} ({a['run_id']})", f"{label_b} ({b['run_id']})"
    return label_a, label_b


def _speed(a: pd.Series, b: pd.Series, name_a: str, name_b: str) -> str:
    seconds_a, seconds_b = _seconds(a), _seconds(b)
    open_runs = [name for run, name in ((a, name_a), (b, name_b)) if _text(run.get("status")) == "running"]
    if open_runs:
        so_far = "; ".join(
            f"{name} is still running ({_took(spent)} so far)" if name in open_runs else f"{name} took {_took(spent)}"
            for name, spent in ((name_a, seconds_a), (name_b, seconds_b))
        )
        return f"No verdict on speed yet: {so_far}."
    if seconds_a is None or seconds_b is None:
        unknown = " and ".join(name for name, s in ((name_a, seconds_a), (name_b, seconds_b)) if s is None)
        return f"The duration of {unknown} is unknown."
    span = f"({_took(seconds_a)} → {_took(seconds_b)})"
    if seconds_a <= 0:
        return f"{name_b} vs {name_a} {span}."
    change = 100 * (seconds_a - seconds_b) / seconds_a
    if abs(change) < SAME_PCT:
        return f"{name_b} takes as long as {name_a} {span}."
    faster = "faster" if change > 0 else "slower"
    return f"{name_b} is {abs(change):.1f} % {faster} than {name_a} {span}."


def _biggest(changes: pd.DataFrame) -> str:
    moved = changes[changes["delta_ns"].fillna(0) != 0] if not changes.empty else changes
    if moved.empty:
        return "No change in kernels, CUDA API calls or memory operations." if not changes.empty else ""
    top = moved.reindex(moved["delta_ns"].abs().sort_values(ascending=False, kind="stable").index).head(BIGGEST)
    labels = unique_short_names(top["name"].astype(str), NAME_WIDTH)
    parts = [f"{labels[str(row['name'])]} {_signed(row['delta_ns'])} ({_pct(row)})" for row in top.to_dict("records")]
    capped = "saturated" in changes.columns and bool(changes["saturated"].fillna(False).any())
    note = f" Sums past {duration(SUM_CAP_NS)} are shown at that cap." if capped else ""
    return f"Biggest change{'s' if len(parts) > 1 else ''}: {', '.join(parts)}.{note}"


def _signed(ns: float) -> str:
    over = "over " if abs(float(ns)) >= SUM_CAP_NS else ""
    return f"{over}{MINUS if ns < 0 else '+'}{duration(abs(float(ns)))}"


def _pct(row: Mapping[Any, Any]) -> str:
    value = row.get("delta_pct")
    if missing(value):  # nothing of the kind in A
        return "new in B"
    pct = float(value)  # type: ignore[arg-type]
    return f"{MINUS if pct < 0 else '+'}{abs(pct):.1f} %"


def _seconds(run: pd.Series) -> float | None:
    value = run.get("duration_s")
    return None if missing(value) else float(value)  # type: ignore[arg-type]


def _took(value: float | None) -> str:
    return "duration unknown" if value is None else seconds(value)


def _text(value: object) -> str:
    return "" if missing(value) else str(value)


# the key figures: compare's column, the figure's words, how a value reads, whether the change is in points
FIGURES: tuple[tuple[str, str, Callable[[Any], str], bool], ...] = (
    ("duration_s", "Duration", seconds, False),
    ("gpus", "GPUs", count, False),
    ("busy_pct", "GPU busy", percent, True),
    ("gpu_util_mean", "GPU utilisation, mean", percent, True),
    ("gpu_util_p95", "GPU utilisation, p95", percent, True),
    ("sm_active_mean", "SMs active, mean", percent, True),
    ("proc_sm_util_mean", "Own processes' SM share, mean", percent, True),
    ("gpu_mem_peak_bytes", "Own processes' GPU memory, peak", size, False),
    ("energy_j", "Energy", lambda v: number(v, "J"), False),
    ("kernels", "Kernels", count, False),
)


def key_figures(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs A and B (the first two rows of Client.compare) as one row per figure that either has:
    Figure, A, B, and Change (B - A, with its % or in percentage points), all text."""
    if len(runs) < 2:
        return pd.DataFrame(columns=["Figure", "A", "B", "Change"])
    a, b = runs.iloc[0], runs.iloc[1]
    rows = []
    for column, words, show, points in FIGURES:
        if column not in runs.columns or (missing(a[column]) and missing(b[column])):
            continue
        shown_a, shown_b = (show(v) if not missing(v) else "" for v in (a[column], b[column]))
        if column == "gpus":
            shown_a, shown_b = (_with_indices(text, run) for text, run in ((shown_a, a), (shown_b, b)))
        rows.append(
            {"Figure": words, "A": shown_a, "B": shown_b, "Change": _change(a[column], b[column], show, points)}
        )
    return pd.DataFrame(rows, columns=["Figure", "A", "B", "Change"])


def _with_indices(text: str, run: pd.Series) -> str:
    indices = _text(run.get("gpu_indices"))
    return f"{text} ({indices})" if text and indices else text


def _change(a: object, b: object, show: Callable[[Any], str], points: bool) -> str:
    if missing(a) or missing(b):
        return ""
    a_value, b_value = float(a), float(b)  # type: ignore[arg-type]
    delta = b_value - a_value
    if delta == 0:
        return "="
    sign = MINUS if delta < 0 else "+"
    if points:
        return f"{sign}{abs(delta):.1f} pts"
    change = f"{sign}{show(abs(delta))}"
    return f"{change} ({sign}{abs(100 * delta / a_value):.1f} %)" if a_value else change
