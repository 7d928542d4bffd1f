"""The Timeline page's capture panel: ask the run's training processes to profile their next steps
into the run (Capture.Request), and what came of the requests so far."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from query.captureframe import captures_frame
from tracehouse.config import default_server
from ui.data import act, command, plain
from ui.tables import styled


def capture_panel(run_id: str, runs: pd.DataFrame) -> None:
    found = runs[runs["run_id"] == run_id]
    if found.empty:
        return
    run = found.iloc[0]
    running = run["source"] == "user" and pd.isna(run["end"])
    with st.expander("Capture: profile this run's next steps", expanded=False):
        if not running:
            why = "it has ended" if run["source"] == "user" else f"it came from {run['source']}, not tracehouse.run"
            st.caption(f"Only a running process that records with tracehouse.run(...) can be captured: {plain(why)}.")
        else:
            left, right = st.columns([1, 3])
            steps = left.number_input("Steps", min_value=1, max_value=1000, value=10, key=f"capture-steps-{run_id}")
            reason = right.text_input("Why (kept with the request)", "", max_chars=1000, key=f"capture-why-{run_id}")
            if st.button(f"Capture the next {int(steps)} steps", key=f"capture-{run_id}", type="primary"):
                asked, why = act("capture", run_id, steps=int(steps), reason=reason)
                if why:
                    st.error(why)
                else:
                    first = asked["first_step"]
                    start = f"step {first}" if first >= 0 else "each process's next step"
                    st.success(f"Asked (`{asked['request_id']}`): from {start}; the outcome shows below "
                               "within seconds (rerun the page to refresh).")  # fmt: skip
        listed, why = act("capture_list", run_id, 20)  # never cached: a request just made shows at once
        if why:
            st.caption(why)
        elif listed:
            frame = captures_frame(listed).drop(columns=["run_id"])
            frame = frame[[*frame.columns[1:], "request_id"]]  # what came of it first, the id last
            frame["requested_ns"] = pd.to_datetime(frame["requested_ns"], unit="ns", utc=True)
            st.dataframe(styled(frame.rename(columns={"requested_ns": "requested"})), hide_index=True)
        elif running:  # the command only where it works: a run that cannot be captured gets none
            st.caption(
                f"No captures of this run yet; also `{command()} capture --run {run_id} --server {default_server()}`."
            )
