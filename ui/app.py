"""The Streamlit app: `tracehouse ui` runs it (`streamlit run ui/app.py`)."""

from __future__ import annotations

import streamlit as st

from tracehouse.config import default_server

st.set_page_config(page_title="tracehouse", layout="wide")
st.sidebar.caption(f"server `{default_server()}`")
pages = [
    st.Page("pages/runs.py", title="Runs", default=True),
    st.Page("pages/timeline.py", title="Timeline"),
    st.Page("pages/kernels.py", title="Kernels & phases"),
    st.Page("pages/compare.py", title="Compare"),
    st.Page("pages/job.py", title="Job"),
    st.Page("pages/sql.py", title="SQL"),
]
st.navigation(pages).run()
