"""One time axis: NVML series per GPU above, GPU streams, NVTX levels and CUDA API calls below.
Select a span on any panel to zoom into it."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import pandas as pd
import streamlit as st

from ui import figures, jobpeers
from ui.capture import capture_panel
from ui.controls import show, stamp, window_sidebar, zoom_buttons
from ui.data import ask, stop_if_empty, trace_file
from ui.view import selected

POINTS = 1500  # per series, and buckets per lane: about a wide screen's pixels
EXACT_EVENTS = 4000  # up to this many events in the window are drawn one by one,
CROWDED = 2  # unless a lane has more than this many in one bucket (about a pixel)
LANE_KINDS = ("kernel", "memcpy", "memset", "cuda_api", "nvtx", "phase", "step", "sync")
TRACE_FILES = {"perfetto": ("Perfetto trace", "pftrace", "application/octet-stream"),
               "chrome": ("Chrome JSON", "json", "application/json")}  # fmt: skip

st.title("Timeline")
stop_if_empty()
scope = window_sidebar()
view = scope.view
window = scope.window()
available = sorted(ask("metrics", **window)["metric"].unique())
shown = [m for m in view.metrics if m in available]
if available:
    metrics = st.multiselect(
        "Metrics",
        available,
        default=shown,
        key=f"metrics-{stamp(view)}",
        help="NVML series, one line per GPU, downsampled on the server to the screen's width",
    )
    if metrics != shown:
        show(replace(view, metrics=tuple(metrics)))
else:
    metrics = []
    where = "This run has" if view.run else "This window has"
    st.caption(
        f"{where} no telemetry (GPU utilisation, memory, power): a trace file holds none, and no agent "
        "sampled these GPUs at the time. Its GPU work is in the lanes below."
    )
kinds = st.multiselect("Lanes", LANE_KINDS, default=LANE_KINDS, help="kinds of events drawn below the series")
ranks = jobpeers.job_ranks(scope)
zoom_buttons(scope, "timeline")

series = ask("series", metrics, max_points=POINTS, **window) if metrics else None
lanes = None
if kinds:
    lanes = (
        jobpeers.lanes_of(ranks, scope, kinds, POINTS) if ranks else ask("lanes", kinds=kinds, buckets=POINTS, **window)
    )
events_in_window = int(lanes.attrs["events"]) if lanes is not None else 0
events = None
if 0 < events_in_window <= EXACT_EVENTS and lanes is not None and lanes["events"].max() <= CROWDED:
    events = (
        jobpeers.events_of(ranks, scope, kinds, EXACT_EVENTS)
        if ranks
        else ask("events", kinds=kinds, limit=EXACT_EVENTS, **window)
    )
if ranks:
    jobpeers.caption(ranks, view.step)
    st.table(jobpeers.clocks(ranks, pd.Series(lanes.attrs["per_rank"] if lanes is not None else {})))
if (series is None or series.empty) and not events_in_window:
    st.info(
        "Nothing in this window. Pick a run in the sidebar, widen the window (a preset, or "
        "`zoom out`), or choose other metrics and lanes."
    )
    st.stop()
if events_in_window and events is None:
    st.caption(
        f"{events_in_window:,} events, too many to tell apart at this width: each lane shows how busy it "
        "was and what took most time, per bucket of about a pixel. Select a span to zoom in; events are "
        "drawn one by one once they are few enough."
    )
drawn = series if series is not None else pd.DataFrame(columns=["host", "gpu", "metric", "bucket_start"])
span = figures.Window(scope.start_ns, scope.end_ns, scope.relative, scope.origin_ns)
figure = figures.timeline(
    span,
    drawn,
    [m for m in metrics if m in set(drawn["metric"])],
    lanes=None if events is not None else lanes,
    events=events,
    known_names=ask("summary", "kernels", run=view.run)["name"].astype(str).tolist()
    if events is not None and view.run
    else (),
    ranks=ranks.order if ranks else (),
)
chosen = st.plotly_chart(
    figure, on_select="rerun", selection_mode="box", key=f"timeline-{stamp(view)}", config={"displaylogo": False}
)
boxes = chosen.selection.box if chosen else []
if boxes:
    x0, x1 = boxes[0]["x"][:2]
    chosen_window = selected(scope.start_ns, x0, x1, span.unit_ns)
    if chosen_window != (scope.start_ns, scope.end_ns):  # the same window again would rerun forever
        show(view.with_window(*chosen_window))
name = re.sub(r"[^A-Za-z0-9._-]+", "-", view.run or "window").strip("-")[:80] or "window"
st.markdown("**Download this window** to open in https://ui.perfetto.dev (or chrome://tracing)")
for column, (fmt, (what, suffix, mime)) in zip(st.columns([1, 1.2, 3])[:2], TRACE_FILES.items(), strict=True):
    column.download_button(
        what,
        data=partial(trace_file, window, fmt),  # fetched on the click, not on every rerun
        file_name=f"tracehouse-{name}-{scope.start_ns}.{suffix}",
        mime=mime,
        key=f"trace-{fmt}",
        help="GPU work, CUDA API calls, NVTX ranges and telemetry of the window shown",
    )
if view.run:
    capture_panel(view.run, ask("runs"))
