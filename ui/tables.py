"""A table with its chart and a CSV download, the way every summary page shows one."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import figures


def table(frame: pd.DataFrame, name: str, what: str, label: str = "", value: str = "", title: str = "") -> None:
    """A sortable table of `what` (said when there is none); with `label` and `value`, a bar
    chart of the largest values first."""
    if frame.empty:
        st.info(f"No {what} in this window.")
        return
    if label and value:
        st.plotly_chart(figures.bars(frame, label, value, title or value), key=f"chart-{name}", width="stretch")
    st.dataframe(frame, hide_index=True, width="stretch")
    st.download_button(
        "Download CSV", frame.to_csv(index=False), file_name=f"{name}.csv", mime="text/csv", key=f"csv-{name}"
    )
