"""The window controls every time-window page shares, kept in the URL so a view can be shared
(and in the session, so moving between pages keeps it)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import pandas as pd
import streamlit as st

from tracehouse import units
from tracehouse.readable import NO_WALL_CLOCK
from ui.data import ask, plain
from ui.figures import moment
from ui.view import PRESETS, RunBounds, View, ViewError, pan, zoom

SESSION_VIEW = "tracehouse.view"


@dataclass(frozen=True)
class Scope:
    """A resolved view: what to ask the server about."""

    view: View
    start_ns: int
    end_ns: int
    relative: bool = False  # the run has no wall clock: instants read as offsets from its start,
    origin_ns: int = 0  # this instant

    def when(self, ns: int) -> str:
        return moment(ns, self.relative, self.origin_ns)

    def window(self) -> dict[str, Any]:
        """Window keywords for the Query client."""
        return {
            "run": self.view.run or None,
            "host": self.view.host or None,
            "start": self.start_ns,
            "end": self.end_ns,
        }


def stamp(view: View) -> str:
    """Changes when the view does: widget keys carry it so that they show the new values."""
    return hashlib.sha1(repr(sorted(view.params().items())).encode()).hexdigest()[:10]


def current_view() -> View:
    params = st.query_params.to_dict()
    if not params and SESSION_VIEW in st.session_state:
        params = dict(st.session_state[SESSION_VIEW])
        st.query_params.from_dict(params)
    return View.from_params(params)


def show(view: View) -> NoReturn:
    """Go to a view: into the URL and the session, and run the page again."""
    st.session_state[SESSION_VIEW] = view.params()
    st.query_params.from_dict(view.params())
    st.rerun()


def run_bounds(runs: pd.DataFrame, run_id: str) -> RunBounds | None:
    found = runs[runs["run_id"] == run_id]
    if found.empty:
        return None
    row = found.iloc[0]
    end = None if pd.isna(row["end"]) else int(row["end"].value)
    return RunBounds(int(row["start"].value), end)


def run_label(runs: pd.DataFrame) -> dict[str, str]:
    """Each run as a picker names it: name, host, source, and when it started (or that it has no wall
    clock, rather than a date in 1970)."""
    relative = runs["relative_time"] if "relative_time" in runs.columns else pd.Series(False, index=runs.index)
    return {
        str(run_id): f"{name or run_id} · {host} · {source} · "
        + (NO_WALL_CLOCK if bool(clockless) else f"{start:%Y-%m-%d %H:%M:%S}")
        for run_id, name, host, source, start, clockless in zip(
            runs["run_id"], runs["name"], runs["host"], runs["source"], runs["start"], relative, strict=True
        )
    }


def is_relative(runs: pd.DataFrame, run_id: str) -> bool:
    """Whether the run's times count from its own start (no wall clock)."""
    found = runs[runs["run_id"] == run_id]
    return bool(not found.empty and "relative_time" in found.columns and found.iloc[0]["relative_time"])


def window_sidebar() -> Scope:
    """The sidebar's run and window pickers, and the resolved window; stops the page with a
    message when the URL holds a window that does not parse."""
    view = current_view()
    runs = ask("runs")
    labels = run_label(runs)
    with st.sidebar.form(key=f"window-{stamp(view)}"):
        st.markdown("**Window**")
        choices = ["", *labels]
        run = st.selectbox(
            "Run",
            choices,
            index=choices.index(view.run) if view.run in choices else 0,
            format_func=lambda run_id: labels.get(run_id, "(any run: the window alone)"),
        )
        presets = ["", *PRESETS]
        preset_of = {v: k for k, v in PRESETS.items()}
        preset = st.selectbox(
            "Preset",
            presets,
            index=presets.index(preset_of[view.last]) if view.last in preset_of else 0,
            format_func=lambda name: name or "(the run, or the times below)",
        )
        start = st.text_input("From", view.start, help="ISO-8601 (2026-11-29T14:02:00Z), ns since the epoch, or now-5m")
        end = st.text_input("To", view.end, help="empty: the run's end, or now")
        host = st.text_input("Host", view.host, help="only this host's telemetry and events")
        if st.form_submit_button("Show", type="primary"):
            chosen = View(run=run, host=host.strip(), start=start.strip(), end=end.strip(), metrics=view.metrics)
            if run == view.run:  # the same rank of a job: its peers stay
                chosen = replace(chosen, job=view.job, step=view.step, peers=view.peers)
            typed = (chosen.start or chosen.end) and (chosen.start, chosen.end) != (view.start, view.end)
            if preset and not typed:  # times typed just now win over the preset still selected
                chosen = chosen.with_preset(PRESETS[preset])
            show(chosen)
    if view.run and view.run not in labels:
        st.warning(f"Run {plain(view.run)} is not in the store (or is still being imported).")
    try:
        start_ns, end_ns = view.window(time.time_ns(), run_bounds(runs, view.run) if view.run else None)
    except ViewError as error:
        st.error(f"The window in the URL does not parse: {plain(str(error))}")
        st.stop()
    bounds = run_bounds(runs, view.run) if view.run else None
    relative = bool(bounds and is_relative(runs, view.run))
    return Scope(view, start_ns, end_ns, relative, bounds.start_ns if bounds and relative else 0)


def zoom_buttons(scope: Scope, key: str) -> None:
    """Zoom out, pan, and back to the run: each writes an absolute window into the URL."""
    columns = st.columns([1.3, 1, 1.2, 1.3, 4], vertical_alignment="center")
    moves = {"◀ earlier": pan(scope.start_ns, scope.end_ns, -0.5), "later ▶": pan(scope.start_ns, scope.end_ns, 0.5),
             "zoom out": zoom(scope.start_ns, scope.end_ns, 2.0)}  # fmt: skip
    for column, (label, (start, end)) in zip(columns, moves.items(), strict=False):
        if column.button(label, key=f"{key}-{label}"):
            show(scope.view.with_window(start, end))
    whole_run = scope.view.run and (scope.view.start or scope.view.end or scope.view.last)
    if whole_run and columns[3].button("whole run", key=f"{key}-run"):
        show(replace(scope.view, start="", end="", last=""))
    width = units.duration(scope.end_ns - scope.start_ns)
    columns[4].caption(f"{scope.when(scope.start_ns)} → {scope.when(scope.end_ns)} ({width})")
