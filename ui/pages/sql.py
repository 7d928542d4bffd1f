"""A read-only SQL console over the store, with its schema beside it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui import figures
from ui.data import ask
from ui.tables import table

EXAMPLE = """SELECT name, count() AS kernels, sum(toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)) AS total_ns
FROM events WHERE kind = 'kernel'
GROUP BY name ORDER BY total_ns DESC LIMIT 20"""
SCHEMA = "SELECT table, name AS column, type, comment FROM columns ORDER BY table, position"

st.title("SQL")
query, schema = st.columns([3, 1])
with schema:
    st.markdown("**Tables**")
    columns = ask("sql", SCHEMA)
    for name, part in columns.groupby("table", sort=True):
        with st.expander(str(name)):
            st.dataframe(part.drop(columns=["table"]), hide_index=True, width="stretch", placeholder="")
with query:
    text = st.text_area("Read-only SQL (one SELECT or WITH query)", EXAMPLE, height=160, key="sql-text")
    limit = st.number_input("At most rows", min_value=1, max_value=1_000_000, value=10_000, step=1000)
    if st.button("Run", type="primary") or "sql-answer" not in st.session_state:
        st.session_state["sql-answer"] = text
    if not st.session_state["sql-answer"].strip():
        st.stop()
    answer = ask("sql", st.session_state["sql-answer"], max_rows=int(limit))
    note = f"{len(answer):,} rows" + (
        " (cut off at the limit: there were more)" if answer.attrs.get("truncated") else ""
    )
    st.caption(note)
    numeric = [c for c in answer.columns if pd.api.types.is_numeric_dtype(answer[c])]
    if len(answer.columns) >= 2 and numeric and len(answer) > 1:
        x = st.selectbox("Chart: x", list(answer.columns), index=0)
        y = st.selectbox("Chart: y", numeric, index=len(numeric) - 1)
        kind = st.radio("Chart", ["bar", "line"], horizontal=True)
        st.plotly_chart(figures.xy(answer.head(5000), str(x), str(y), bar=kind == "bar"), width="stretch")
    table(answer, "query_result", "rows")
