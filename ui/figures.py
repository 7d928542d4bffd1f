"""Plotly figures from query answers. Pure: DataFrames in, figures out.

The timeline's time axis is seconds from the window's start, as in Nsight Systems: float64
keeps ns apart over days, where a date axis would round to the millisecond.
"""

from __future__ import annotations

import html
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tracehouse.model import LANE_COLUMNS, lane_of
from tracehouse.timefmt import NS_PER_S, format_duration, format_ns

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
KIND_COLORS = {"kernel": "#4e79a7", "memcpy": "#f28e2b", "memset": "#edc948", "cuda_api": "#9c9c9c",
               "sync": "#e15759", "osrt": "#9c755f"}  # fmt: skip
METRIC_ROW_PX = 170
LANE_ROW_PX = 24
SCATTERGL_FROM_POINTS = 20_000  # SVG is smoother below, WebGL keeps up above
LANE_ORDER = {"gpu": 0, "nvtx": 1, "phase": 1, "step": 1, "cuda_api": 2}


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int

    def seconds(self, ns: pd.Series | np.ndarray) -> np.ndarray:
        return (np.asarray(ns, dtype=np.int64) - self.start_ns) / NS_PER_S

    @property
    def width_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S


def color_of(name: str) -> str:
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


def lane_label(lane: str, host: str, gpu: int, stream: int, pid: int, tid: int, depth: int, hosts: int) -> str:
    """Names every field of the lane that tells it apart (the host only where there are several)."""
    parts = [html.escape(host)] if hosts > 1 else []
    if lane == "gpu":
        return " · ".join([*parts, f"GPU {gpu}", f"stream {stream}"])
    parts.append("NVTX" if lane == "nvtx" else lane)
    parts += [f"GPU {gpu}"] if gpu >= 0 else []
    parts += [f"stream {stream}"] if stream >= 0 else []
    parts += [f"pid {pid}", f"tid {tid}"]
    parts += [f"L{depth}"] if depth else []
    return " · ".join(parts)


def lane_keys(events: pd.DataFrame) -> pd.DataFrame:
    """The lane of each event, by the rule the Lanes query applies."""
    lane = events["kind"].map(lane_of)
    on_gpu = lane == "gpu"
    return pd.DataFrame(
        {
            "lane": lane,
            "host": events["host"],
            "gpu": events["gpu"].astype(int),
            "stream": events["stream"].astype(int),
            "pid": events["pid"].where(~on_gpu, 0).astype(int),
            "tid": events["tid"].where(~on_gpu, 0).astype(int),
            "depth": events["depth"].where(~on_gpu, 0).astype(int),
        }
    )


def _ordered_labels(keys: pd.DataFrame) -> tuple[list[str], pd.Series]:
    """Each row's lane label, and every label top to bottom: GPU streams, then per thread
    its NVTX levels, CUDA API, and the rest."""
    hosts = keys["host"].nunique()
    distinct = keys.drop_duplicates(subset=list(LANE_COLUMNS))
    distinct = distinct.assign(
        family=distinct["lane"].map(lambda lane: LANE_ORDER.get(lane, 3)),
        by_thread=distinct["lane"] != "gpu",
    ).sort_values(["host", "by_thread", "gpu", "stream", "pid", "tid", "family", "lane", "depth"])
    label_of = {
        (lane, host, gpu, stream, pid, tid, depth): lane_label(lane, host, gpu, stream, pid, tid, depth, hosts)
        for lane, host, gpu, stream, pid, tid, depth in distinct[list(LANE_COLUMNS)].itertuples(index=False)
    }
    seen: dict[str, int] = {}
    for key, label in label_of.items():  # never two lanes on one row
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label_of[key] = f"{label} ({seen[label]})"
    labels = pd.Series([label_of[tuple(k)] for k in keys[list(LANE_COLUMNS)].itertuples(index=False)], index=keys.index)
    return list(label_of.values()), labels


def timeline(
    window: Window,
    series: pd.DataFrame,
    metrics: Sequence[str],
    lanes: pd.DataFrame | None = None,
    events: pd.DataFrame | None = None,
) -> go.Figure:
    """Stacked panels on one time axis: a row per metric (a line per host and GPU), then the
    lanes, drawn event by event from `events`, or as busy cells from quantized `lanes`."""
    lane_rows = events if events is not None else lanes
    has_lanes = lane_rows is not None and not lane_rows.empty
    rows = len(metrics) + (1 if has_lanes else 0)
    if rows == 0:
        return go.Figure()
    lane_count = 0
    order: list[str] = []
    labels = pd.Series(dtype=object)
    if has_lanes:
        assert lane_rows is not None
        keys = lane_keys(lane_rows) if events is not None else lane_rows[list(LANE_COLUMNS)]
        order, labels = _ordered_labels(keys)
        lane_count = len(order)
    heights = [METRIC_ROW_PX] * len(metrics) + ([max(120, LANE_ROW_PX * lane_count)] if has_lanes else [])
    figure = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.04, 0.3 / rows),
        row_heights=heights,
    )
    total_points = len(series)
    for row, metric in enumerate(metrics, start=1):
        for (host, gpu), part in series[series["metric"] == metric].groupby(["host", "gpu"], sort=True):
            name = html.escape(f"{host} GPU {gpu}" if int(str(gpu)) >= 0 else str(host))
            _add_series(figure, window, part, name, row, total_points)
        figure.update_yaxes(title_text=html.escape(metric), title_font={"size": 11}, row=row, col=1)
    if has_lanes:
        if events is not None:
            _add_events(figure, window, events, labels, rows)
        else:
            assert lanes is not None
            _add_busy_cells(figure, window, lanes, labels, order, rows)
        figure.update_yaxes(categoryorder="array", categoryarray=order[::-1], row=rows, col=1)
    figure.update_xaxes(range=[0, window.width_s], row=rows, col=1)
    figure.update_xaxes(title_text=f"seconds from {format_ns(window.start_ns)}", row=rows, col=1)
    figure.update_layout(
        height=sum(heights) + 60 * rows + 80,
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        dragmode="select",
        selectdirection="h",
        hovermode="closest",
        barmode="overlay",
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
    )
    return figure


def _add_series(figure: go.Figure, window: Window, part: pd.DataFrame, name: str, row: int, total: int) -> None:
    kind = go.Scattergl if total > SCATTERGL_FROM_POINTS else go.Scatter
    starts = part["bucket_start"].astype("int64")
    figure.add_trace(
        kind(
            x=window.seconds(starts),
            y=part["avg"],
            mode="lines",
            name=name,
            legendgroup=name,
            showlegend=row == 1,
            line={"color": color_of(name), "width": 1.5},
            customdata=np.stack([part["min"], part["max"], part["count"]], axis=-1),
            hovertemplate=f"{name}<br>%{{x:.6f}} s<br>avg %{{y:.4g}} (min %{{customdata[0]:.4g}}, "
            "max %{customdata[1]:.4g}, %{customdata[2]} samples)<extra></extra>",
        ),
        row=row,
        col=1,
    )


def _add_events(figure: go.Figure, window: Window, events: pd.DataFrame, labels: pd.Series, row: int) -> None:
    starts = events["start"].astype("int64")
    ends = events["end"].astype("int64")
    pixel_s = window.width_s / 1500
    for kind, part in events.groupby("kind", sort=True):
        index = part.index
        begin = window.seconds(starts[index])
        length = (ends[index] - starts[index]).to_numpy() / NS_PER_S
        colors = part["name"].map(color_of) if kind in ("nvtx", "phase", "step") else KIND_COLORS.get(str(kind), "#888")
        details = np.stack(
            [
                part["name"].astype(str).str.slice(0, 200).map(html.escape),
                (ends[index] - starts[index]).map(format_duration),
                starts[index].map(format_ns),
                part["correlation_id"].astype(str),
            ],
            axis=-1,
        )
        hover = (
            f"<b>%{{customdata[0]}}</b><br>{kind}, %{{customdata[1]}}<br>start %{{customdata[2]}}"
            "<br>correlation %{customdata[3]}<extra>%{y}</extra>"
        )
        figure.add_trace(
            go.Bar(
                x=np.maximum(length, pixel_s),  # a slice is drawn at least a pixel wide
                base=begin,
                y=labels[index],
                orientation="h",
                name=str(kind),
                marker={"color": colors, "line": {"width": 0}},
                width=0.8,
                customdata=details,
                hovertemplate=hover,
            ),
            row=row,
            col=1,
        )


def _add_busy_cells(
    figure: go.Figure, window: Window, lanes: pd.DataFrame, labels: pd.Series, order: list[str], row: int
) -> None:
    width_ns = int(lanes.attrs["bucket_ns"])
    start_ns = int(lanes.attrs["start_ns"])
    buckets = ((lanes["bucket_start_ns"].astype("int64") - start_ns) // width_ns).to_numpy()
    count = int(buckets.max()) + 1
    position = {label: i for i, label in enumerate(order)}
    rows_of = labels.map(position).to_numpy()
    busy = lanes["busy_ns"].to_numpy() / width_ns
    shade = np.full((len(order), count), np.nan)
    shade[rows_of, buckets] = np.maximum(busy, 0.04)  # a bucket of instants stays visible
    details = np.full((len(order), count, 3), "", dtype=object)
    details[rows_of, buckets, 0] = lanes["events"].astype(str).to_numpy()
    details[rows_of, buckets, 1] = lanes["top_name"].astype(str).str.slice(0, 120).map(html.escape).to_numpy()
    details[rows_of, buckets, 2] = [f"{share:.0%}" for share in busy]
    figure.add_trace(
        go.Heatmap(
            z=shade,
            x0=float(window.seconds(np.array([start_ns + width_ns // 2]))[0]),
            dx=width_ns / NS_PER_S,
            y=order,
            zmin=0,
            zmax=1,
            colorscale="Blues",
            showscale=False,
            customdata=details,
            hovertemplate="%{y}<br>%{x:.6f} s<br>%{customdata[0]} events, busy %{customdata[2]}"
            "<br>most time: %{customdata[1]}<extra></extra>",
        ),
        row=row,
        col=1,
    )


def bars(frame: pd.DataFrame, label: str, value: str, title: str, top: int = 20) -> go.Figure:
    """The `top` rows by |value|, largest on top; rows without a value are left out."""
    frame = frame[frame[value].notna()]
    if frame.empty:
        return go.Figure()
    shown = frame.reindex(frame[value].abs().sort_values(ascending=False).index).head(top)
    figure = go.Figure(
        go.Bar(
            x=shown[value],
            y=shown[label].astype(str).str.slice(0, 80).map(html.escape),
            orientation="h",
            marker={"color": [PALETTE[0] if v >= 0 else PALETTE[2] for v in shown[value]]},
            hovertemplate="%{y}<br>%{x:,}<extra></extra>",
        )
    )
    figure.update_layout(
        title=title,
        height=120 + 22 * len(shown),
        yaxis={"autorange": "reversed"},
        margin={"l": 10, "r": 10, "t": 40, "b": 30},
    )
    return figure
