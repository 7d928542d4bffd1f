"""A distributed job: which rank holds it back, by how much and why; a rank x step heat map of the step
time or any of its parts, a cell opening that rank's timeline at that step with its peers' lanes below it;
its collectives and ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from query.jobclient import headline
from tracehouse import units
from ui.data import ask, attempt, plain
from ui.peers import default_peers, members, peers_text, step_ns
from ui.tables import styled
from ui.view import View

MEASURES = {"step time": "dur_ns", "compute": "compute_ns", "exposed communication": "comm_ns",
            "data loading": "data_ns", "idle": "idle_ns"}  # fmt: skip
MAX_CELLS = 400_000  # drawn: steps are averaged in buckets past it
SVG_CELLS = 20_000  # markers drawn as SVG up to this, WebGL past it


def heat(steps: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(ranks, first step of each bucket, ms per rank and bucket, steps per bucket)."""
    ranks = np.sort(steps["rank"].unique())
    numbers = np.sort(steps["step"].unique())
    per = max(1, int(np.ceil(numbers.size * ranks.size / MAX_CELLS)))
    bucket = np.searchsorted(numbers, steps["step"].to_numpy()) // per
    row = np.searchsorted(ranks, steps["rank"].to_numpy())
    total = np.zeros((ranks.size, bucket.max() + 1))
    count = np.zeros_like(total)
    np.add.at(total, (row, bucket), steps[column].to_numpy() / 1e6)
    np.add.at(count, (row, bucket), 1)
    with np.errstate(invalid="ignore"):
        return ranks, numbers[::per], np.where(count > 0, total / np.maximum(count, 1), np.nan), per


def heat_figure(ranks: np.ndarray, firsts: np.ndarray, grid: np.ndarray) -> go.Figure:
    """The heat map, and over each cell an invisible marker that a click selects (a heat map's cells
    cannot be selected in plotly), outlined once chosen."""
    columns, rows = np.meshgrid(firsts, ranks)
    drawn = np.isfinite(grid)
    cells = go.Scattergl if drawn.sum() > SVG_CELLS else go.Scatter
    return go.Figure(
        [
            go.Heatmap(z=grid, x=firsts, y=ranks, colorscale="Viridis", colorbar={"title": "ms"}, hoverinfo="skip"),
            cells(x=columns[drawn], y=rows[drawn], customdata=grid[drawn], mode="markers", showlegend=False,
                  marker={"symbol": "square-open", "size": 14, "color": "#ffffff", "line": {"width": 2}, "opacity": 0},
                  selected={"marker": {"opacity": 1}}, unselected={"marker": {"opacity": 0}},
                  hovertemplate="rank %{y}, step %{x}: %{customdata:.3g} ms<extra></extra>"),
        ]
    )  # fmt: skip


st.title("Job")
job = st.text_input("Job id", value=st.query_params.get("job", ""), placeholder="the id its runs name")
pattern = st.text_input("Steps (a regular expression over step numbers)", value=st.query_params.get("steps", ""))
if not job:
    st.info("Name a job: its ranks' runs carry it (`tracehouse run --job ID`, `tracehouse import --job ID FILES`, "
            "`tracehouse.run(..., job=ID)`, or torchrun/Slurm/MPI variables).")  # fmt: skip
    st.stop()
st.query_params.update({"job": job, "steps": pattern})
view = ask("job", job, steps=pattern)
lines = headline(view)
st.markdown("\n".join(f"- {plain(line.strip())}" for line in lines))
for note in view.notes:
    st.caption(plain(note))
measure = st.radio("Heat map of", list(MEASURES), horizontal=True)
detail, why = attempt("job", job, steps=pattern, step_rows=True)
if why:
    st.warning(f"{why}\n\nNarrow the steps above to see the heat map.")
elif detail.steps is not None and not detail.steps.empty:
    steps = detail.steps
    ranks, firsts, grid, per = heat(steps, MEASURES[measure])
    figure = heat_figure(ranks, firsts, grid)
    figure.update_layout(xaxis_title="step" + (f" (mean of {per} a cell)" if per > 1 else ""), yaxis_title="rank",
                         height=min(900, 200 + max(6 * ranks.size, min(24 * ranks.size, 600))))  # fmt: skip
    picked = st.plotly_chart(figure, on_select="rerun", selection_mode="points", key="heat")
    selection: Any = picked.get("selection", {}) if isinstance(picked, dict) else {}
    points: list[Any] = list(selection.get("points", []))
    if points:
        rank, step = int(points[0]["y"]), int(points[0]["x"])
        cell = steps[(steps["rank"] == rank) & (steps["step"] == step)]
        run = view.ranks.set_index("rank")["run_id"].get(rank, "")
        if not cell.empty and run:
            start = int(cell["start_ns"].iloc[0])
            placed, _ = members(view.ranks, rank)
            peers = default_peers(rank, [r for r in placed if r != rank], step_ns(steps, step))
            timeline = View(run=run, start=str(start), end=str(start + int(cell["dur_ns"].iloc[0])), job=job,
                            step=str(step), peers=peers_text(peers))  # fmt: skip
            st.page_link("pages/timeline.py", label=f"Rank {rank}'s timeline at step {step}, its peers below",
                         query_params=timeline.params())  # fmt: skip
tabs = st.tabs(["Stragglers", "Ranks", "Collectives", "Telemetry"])
for tab, frame in zip(tabs, (view.stragglers, view.ranks, view.collectives, view.telemetry), strict=True):
    with tab:
        if frame.empty:
            st.info("None.")
        else:
            st.dataframe(styled(frame), hide_index=True, width="stretch", placeholder="")
st.caption(f"Steps per rank: {units.count(float(view.ranks['steps'].median()) if not view.ranks.empty else 0)}")
