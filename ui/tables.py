"""A table with its chart and a CSV download, the way every summary page shows one: cells in human
units over the exact values (so that sorting stays numeric), the CSV exact for programs."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st
from pandas.io.formats.style import Styler

from tracehouse import units
from tracehouse.readable import COUNTS, METRIC_VALUES, OPAQUE_IDS, column_kind, formatters, headers
from tracehouse.shortnames import unique_short_names
from ui import figures

FOR_PROGRAMS = ("name_cut",)  # a cut name already ends in … where people read it; the CSV keeps the flag
SHORT = "short name"  # as the chart labels it; the full name stays in its own column


def styled(frame: pd.DataFrame, origin_ns: int | None = None) -> Styler:
    """`frame` for people: headers in words, cells in human units (instants as offsets from
    `origin_ns` where given, else ISO), missing values blank, internal ids left out. The values
    underneath stay the answer's own."""
    shown = frame.drop(columns=[c for c in (*OPAQUE_IDS, *FOR_PROGRAMS) if c in frame.columns]).reset_index(drop=True)
    shown.columns = [str(c) for c in shown.columns]
    cells = formatters(shown, origin_ns)
    for column in shown.columns:  # a count per run (`instances_a`) reads as a count: 4,350
        if re.sub(r"_[ab]$", "", column) in COUNTS:
            cells[column] = units.count
    for column in shown.columns:
        shown[column], cells[column] = _exact_below_2_53(shown[column], cells[column], origin_ns)
    names = headers(shown)
    shown = shown.rename(columns=names)
    styler = shown.style.format({names[c]: show for c, show in cells.items()})
    if "metric" in names:  # min/avg/max of one metric a row: each row reads in its metric's unit
        values = [names[c] for c in METRIC_VALUES if c in names]
        for metric in shown[names["metric"]].dropna().unique():
            rows = shown.index[shown[names["metric"]] == metric]
            styler = styler.format(reading(str(metric)), subset=(rows, values))
    return styler


def _exact_below_2_53(
    values: pd.Series, show: Callable[[Any], str], origin_ns: int | None
) -> tuple[pd.Series, Callable[[Any], str]]:
    """Streamlit's grid draws integers past 2**53 raw (with a warning), whatever the Styler says:
    instants in ns become offsets from `origin_ns` (exact and sortable) or timestamps, and other
    such integers text."""
    if not pd.api.types.is_integer_dtype(values.dtype):
        return values, show
    largest = values.dropna().abs().max()
    if pd.isna(largest) or largest < 2**53:
        return values, show
    if column_kind(str(values.name), values) == "instant":
        if origin_ns is not None:
            return values.astype("Int64") - origin_ns, units.offset
        return pd.to_datetime(values.astype("Int64"), unit="ns", utc=True), show
    return values.map(lambda v: "" if pd.isna(v) else str(v)), lambda text: show(int(text)) if text else ""


def reading(metric: str) -> Callable[[Any], str]:
    return lambda value: units.metric_value(metric, value)


def fitting_rows(frame: pd.DataFrame) -> int:
    """How many rows of `frame` the table can style at once (Streamlit refuses more cells)."""
    limit = int(pd.get_option("styler.render.max_elements"))
    return max(1, limit // max(1, len(frame.columns)))


def table(
    frame: pd.DataFrame,
    name: str,
    what: str,
    label: str = "",
    value: str = "",
    title: str = "",
    *,
    origin_ns: int | None = None,
    top: int | None = None,
    full_names: bool = True,
    csv: pd.DataFrame | None = None,
) -> None:
    """A sortable table of `what` (said when there is none); with `label` and `value`, a bar
    chart of the largest values first. Instants read from `origin_ns` when given (say it once
    above, with `origin_caption`). The table shows the first `top` rows, the CSV all; with
    `full_names` False, long names only in their short form (the CSV and the hover have them whole).
    The CSV holds `csv` where given (the exact answer behind a frame shaped for people), else `frame`."""
    if frame.empty:
        st.info(f"No {what} in this window.")
        return
    shown = frame
    if label and value:
        names = frame[label].astype(str)
        labels = unique_short_names(names.unique(), figures.BAR_LABEL_WIDTH)
        chart = figures.bars(frame, label, value, title or value, labels=labels)
        st.plotly_chart(chart, key=f"chart-{name}", width="stretch")
        if any(labels[n] != n for n in labels):  # rows read apart by the bars' labels; the full name last
            rest = [c for c in frame.columns if c != label]
            shown = frame.assign(**{SHORT: names.map(labels)})[[SHORT, *rest, *([label] if full_names else [])]]
    rows = min(fitting_rows(shown), top or len(shown))
    if len(shown) > rows:
        st.caption(f"The first {rows:,} of {len(shown):,} {what} are shown; the CSV holds them all.")
    st.dataframe(styled(shown.head(rows), origin_ns), hide_index=True, width="stretch", placeholder="")
    st.download_button(
        "Download CSV",
        (frame if csv is None else csv).to_csv(index=False),
        file_name=f"{name}.csv",
        mime="text/csv",
        key=f"csv-{name}",
    )


def origin_caption(origin_ns: int, relative: bool = False, run_start_ns: int = 0) -> str:
    """The one instant that a window's offsets count from (for a run without a wall clock, as an offset
    from the run's start)."""
    if relative:
        return (
            f"Times are from the window's start, {figures.moment(origin_ns, True, run_start_ns)} from the run's start."
        )
    return f"Times are from the window's start, {units.instant(origin_ns)}."
