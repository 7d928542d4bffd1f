"""Every run and host: find runs, pick one for the timeline or two to compare."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from query.rungpus import gpu_counts
from tracehouse.model import RUN_SOURCES
from tracehouse.readable import run_starts
from ui.controls import SESSION_VIEW, run_label
from ui.data import ask, stop_if_empty
from ui.tables import styled
from ui.view import View

TAG_CHAR_PX = 8  # a character of the grid's font, at most

st.title("Runs")
stop_if_empty()
search, host, source = st.columns([3, 2, 2])
text = search.text_input("Search names", placeholder="resnet, bs256, ...")
runs = ask("runs")
hosts = sorted(runs["host"].unique())
chosen_host = host.selectbox("Host", ["", *hosts], format_func=lambda h: h or "(all)")
chosen_source = source.selectbox("Source", ["", *RUN_SOURCES], format_func=lambda s: s or "(all)")
found = ask("runs", host=chosen_host, source=chosen_source, name_contains=text.strip())
devices = ask("devices")
gpus = gpu_counts(found, devices, lambda runs: ask("compare", runs))
table = pd.DataFrame(  # what tells runs apart first; the id last, for the CLI (hidden: said when picked)
    {
        "name": found["name"],
        # tags next to the name they qualify: the columns after them may run past a narrow screen's edge
        "tags": [", ".join(f"{k}={v}" for k, v in sorted(tags.items())) for tags in found["tags"]],
        "start": run_starts(found["start"], found["relative_time"]),
        "duration_s": (found["end"] - found["start"]).dt.total_seconds(),
        "gpus": pd.array([gpus.get(run) for run in found["run_id"]], dtype="Int64"),
        "host": found["host"],
        "source": found["source"],
        "run": found["run_id"],
    }
)
st.caption(f"{len(table)} runs" + (" (open runs have no duration yet)" if table["duration_s"].isna().any() else ""))
longest = max((len(tags) for tags in table["tags"]), default=0)  # the grid sized it by a sample of cells: cut
tags_width = min(max(TAG_CHAR_PX * longest + 24, 60), 400)
st.dataframe(
    styled(table), hide_index=True, width="stretch", placeholder="",
    # the id is for the CLI: said under the picker once a run is picked, so the columns people read fit
    column_config={"tags": st.column_config.TextColumn(width=tags_width), "run": None},
)  # fmt: skip
labels = run_label(found)
selected = st.multiselect(
    "Select one run for its timeline, or two to compare",
    list(labels),
    format_func=lambda run: labels.get(run, run),
    max_selections=2,
)
if selected:
    st.caption("For the CLI (`--run`): " + ", ".join(f"`{run}`" for run in selected))
timeline, compare, _ = st.columns([1, 1, 4])
if timeline.button("Open timeline", disabled=len(selected) != 1, type="primary"):
    view = View(run=selected[0])
    st.session_state[SESSION_VIEW] = view.params()
    st.switch_page("pages/timeline.py", query_params=view.params())
if compare.button("Compare", disabled=len(selected) != 2):
    st.switch_page("pages/compare.py", query_params={"a": selected[0], "b": selected[1]})
if not devices.empty:
    with st.expander(f"GPUs ({len(devices)})"):
        st.dataframe(styled(devices.drop(columns=["attrs"])), hide_index=True, width="stretch", placeholder="")
