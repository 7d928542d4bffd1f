"""Plotly figures from query answers. Pure: DataFrames in, figures out. What a person reads on
them (axes, hovers) is in human units; the values drawn are the answer's, scaled to one unit.

The timeline's time axis is an offset from the window's start (s, ms or µs by the window's
width), as in Nsight Systems: float64 keeps ns apart over days, where a date axis would round
to the millisecond.
"""

from __future__ import annotations

import html
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tracehouse import units
from tracehouse.model import LANE_COLUMNS, lane_of
from tracehouse.readable import column_kind, formatter, header
from tracehouse.shortnames import unique_short_names
from tracehouse.timefmt import format_instant

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
KIND_COLORS = {"kernel": "#4e79a7", "memcpy": "#f28e2b", "memset": "#edc948", "cuda_api": "#9c9c9c",
               "sync": "#e15759", "osrt": "#9c755f"}  # fmt: skip
# NVTX ranges, phases and steps: light violets, teals and pinks, hatched, never one of the kinds' colours
RANGE_PALETTE = ("#d4c4ec", "#b9e2dc", "#f4c7dc", "#c9d6f2", "#e3d3f5", "#bfe6c9", "#f2d4e9", "#d0e4ec")
RANGE_KINDS = ("nvtx", "phase", "step")
RANGE_LINE = "#6b5b95"
BUSY_TITLE = "share of bucket busy, %"
LESS, MORE = "#59a14f", "#e15759"  # a change for the better, for the worse
BAR_LABEL_WIDTH = 60  # characters of a bar's label; the full name is on hover and in the table
HOVER_LINE = 100
SQL_LABEL_WIDTH = 24
AXIS_UNITS = {"duration": "ns", "size": "B", "rate": "B/s", "percent": "%", "power": "W", "energy": "J",
              "clock": "MHz", "seconds": "s"}  # fmt: skip
METRIC_ROW_PX = 170
LANE_ROW_PX = 24
SCATTERGL_FROM_POINTS = 20_000  # SVG is smoother below, WebGL keeps up above
LANE_ORDER = {"gpu": 0, "nvtx": 1, "phase": 1, "step": 1, "cuda_api": 2}
TIMELINE_PX = 1100  # about the plot's width at 1280 px, for which slices are wide enough to label
LABEL_CHAR_PX = 7  # a slice holds a label of about its width over this many characters
MIN_LABEL_CHARS = 3  # narrower slices carry no text (Perfetto's rule of thumb: nothing unreadable)
LABEL_FONT_PX = 10
HOVER_CHARS = 2000  # a hover shows names whole up to this, wrapped; the table and the CSV beyond


@dataclass(frozen=True)
class Window:
    """The timeline's window; its time axis reads in one unit (s, ms or µs) chosen by its width."""

    start_ns: int
    end_ns: int
    relative: bool = False  # a run without a wall clock: its times are offsets from its start,
    origin_ns: int = 0  # this instant

    @property
    def scale(self) -> tuple[float, str]:
        return units.axis_scale("ns", self.end_ns - self.start_ns)

    @property
    def unit_ns(self) -> float:
        return self.scale[0]

    def offsets(self, ns: pd.Series | np.ndarray) -> np.ndarray:
        """Instants as positions on the time axis."""
        return (np.asarray(ns, dtype=np.int64) - self.start_ns) / self.unit_ns

    @property
    def width(self) -> float:
        return (self.end_ns - self.start_ns) / self.unit_ns

    @property
    def axis_title(self) -> str:
        if self.relative:  # a trace without a wall clock: from the run's start
            start = f" {moment(self.start_ns, True, self.origin_ns)}" if self.start_ns != self.origin_ns else ""
            return f"time from the run's start{start} ({self.scale[1]})"
        return f"time from {units.instant(self.start_ns)} ({self.scale[1]})"


def moment(ns: int, relative: bool, origin_ns: int = 0) -> str:
    """An instant as people read it (the CLI's rule, timefmt.format_instant): a date, or for a run
    without a wall clock its offset from the run's start `origin_ns` (`+3.362 s`), never 1970."""
    return format_instant(ns, not relative, origin_ns)


def color_of(name: str, palette: Sequence[str] = PALETTE) -> str:
    return palette[zlib.crc32(name.encode()) % len(palette)]


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
    """The lane of each event, by the rule the Lanes query applies (and its job rank, where it has one)."""
    lane = events["kind"].map(lane_of)
    on_gpu = lane == "gpu"
    return pd.DataFrame(
        {
            **({"rank": events["rank"]} if "rank" in events.columns else {}),
            "lane": lane,
            "host": events["host"],
            "gpu": events["gpu"].astype(int),
            "stream": events["stream"].astype(int),
            "pid": events["pid"].where(~on_gpu, 0).astype(int),
            "tid": events["tid"].where(~on_gpu, 0).astype(int),
            "depth": events["depth"].where(~on_gpu, 0).astype(int),
        }
    )


def _ordered_labels(keys: pd.DataFrame, ranks: Sequence[int] = ()) -> tuple[list[str], pd.Series]:
    """Each row's lane label, and every label top to bottom: GPU streams, then per thread
    its NVTX levels, CUDA API, and the rest; with `ranks` (keys with a rank column), each rank's lanes
    in that order, labelled with it."""
    columns = ["rank", *LANE_COLUMNS] if ranks else list(LANE_COLUMNS)
    hosts = 1 if ranks else keys["host"].nunique()  # a rank names its host
    distinct = keys.drop_duplicates(subset=columns)
    place = {rank: i for i, rank in enumerate(ranks)}
    distinct = distinct.assign(
        family=distinct["lane"].map(lambda lane: LANE_ORDER.get(lane, 3)),
        by_thread=distinct["lane"] != "gpu",
        place=distinct["rank"].map(place) if ranks else 0,
    ).sort_values(["place", "host", "by_thread", "gpu", "stream", "pid", "tid", "family", "lane", "depth"])
    label_of = {}
    for key in distinct[columns].itertuples(index=False, name=None):
        lane, host, gpu, stream, pid, tid, depth = key[-7:]
        own = lane_label(lane, host, int(gpu), int(stream), int(pid), int(tid), int(depth), hosts)
        label_of[key] = f"rank {key[0]} · {own}" if ranks else own
    seen: dict[str, int] = {}
    for key, label in label_of.items():  # never two lanes on one row
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label_of[key] = f"{label} ({seen[label]})"
    labels = pd.Series([label_of[k] for k in keys[columns].itertuples(index=False, name=None)], index=keys.index)
    return list(label_of.values()), labels


def timeline(
    window: Window,
    series: pd.DataFrame,
    metrics: Sequence[str],
    lanes: pd.DataFrame | None = None,
    events: pd.DataFrame | None = None,
    known_names: Sequence[str] = (),
    ranks: Sequence[int] = (),
) -> go.Figure:
    """Stacked panels on one time axis: a row per metric (a line per host and GPU), then the
    lanes, drawn event by event from `events`, or as busy cells from quantized `lanes`. Slices are
    labelled with their short name among `known_names` too (the run's kernels: the labels its
    Kernels table shows). `ranks`: the lanes (or events) carry a job's rank, drawn in this order."""
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
        keys = lane_keys(lane_rows) if events is not None else lane_rows
        order, labels = _ordered_labels(keys, ranks)
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
        readings = series[series["metric"] == metric]
        scale, unit = units.axis_scale(units.metric_unit(metric), float(readings["max"].abs().max()))
        for (host, gpu), part in readings.groupby(["host", "gpu"], sort=True):
            name = html.escape(f"{host} GPU {gpu}" if int(str(gpu)) >= 0 else str(host))
            _add_series(figure, window, part, name, row, total_points, (metric, scale))
        title = f"{metric} ({unit})" if unit else metric
        figure.update_yaxes(title_text=html.escape(title), title_font={"size": 11}, row=row, col=1)
    if has_lanes:
        if events is not None:
            _add_events(figure, window, events, labels, rows, known_names)
        else:
            assert lanes is not None
            _add_busy_cells(figure, window, lanes, labels, order, rows)
        figure.update_yaxes(categoryorder="array", categoryarray=order[::-1], row=rows, col=1)
        _rank_bands(figure, order, ranks, rows)
    figure.update_xaxes(range=[0, window.width], row=rows, col=1)
    figure.update_xaxes(title_text=window.axis_title, row=rows, col=1)
    figure.update_layout(
        height=sum(heights) + 60 * rows + 80,
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        dragmode="select",
        selectdirection="h",
        hovermode="closest",
        barmode="overlay",
        uniformtext={"minsize": LABEL_FONT_PX - 2, "mode": "hide"},  # a label that does not fit is left out
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
    )
    return figure


def _rank_bands(figure: go.Figure, order: list[str], ranks: Sequence[int], row: int) -> None:
    """Every other rank's lanes on a shaded band, so that each rank's rows read as one block."""
    for shade, rank in enumerate(ranks):
        rows = [i for i, label in enumerate(order) if label.startswith(f"rank {rank} · ")]
        if rows and shade % 2:  # categories sit at 0..n-1, the first label on top
            top, bottom = len(order) - 1 - rows[0], len(order) - 1 - rows[-1]
            figure.add_hrect(y0=bottom - 0.5, y1=top + 0.5, fillcolor="#f0f2f6", line_width=0, layer="below",
                             row=row, col=1)  # fmt: skip


def _add_series(
    figure: go.Figure, window: Window, part: pd.DataFrame, name: str, row: int, total: int, scaled: tuple[str, float]
) -> None:
    metric, scale = scaled
    kind = go.Scattergl if total > SCATTERGL_FROM_POINTS else go.Scatter
    starts = part["bucket_start"].astype("int64")
    reading = [units.metric_value(metric, v) for v in part["avg"]]
    details = np.stack(
        [
            [units.offset(int(s) - window.start_ns) for s in starts],
            reading,
            [units.metric_value(metric, v) for v in part["min"]],
            [units.metric_value(metric, v) for v in part["max"]],
            [units.count(v) for v in part["count"]],
        ],
        axis=-1,
    )
    figure.add_trace(
        kind(
            x=window.offsets(starts),
            y=part["avg"] / scale,
            mode="lines",
            name=name,
            legendgroup=name,
            showlegend=row == 1,
            line={"color": color_of(name), "width": 1.5},
            customdata=details,
            hovertemplate=f"{name}<br>%{{customdata[0]}}<br>avg %{{customdata[1]}} (min %{{customdata[2]}}, "
            "max %{customdata[3]}, %{customdata[4]} samples)<extra></extra>",
        ),
        row=row,
        col=1,
    )


def _add_events(
    figure: go.Figure, window: Window, events: pd.DataFrame, labels: pd.Series, row: int, known: Sequence[str]
) -> None:
    starts = events["start"].astype("int64")
    ends = events["end"].astype("int64")
    pixel = window.width / 1500
    short = unique_short_names({*known, *events["name"].astype(str)}, BAR_LABEL_WIDTH)
    for kind, part in events.groupby("kind", sort=True):
        index = part.index
        begin = window.offsets(starts[index])
        length = (ends[index] - starts[index]).to_numpy() / window.unit_ns
        details = np.stack(
            [
                part["name"].astype(str).map(wrapped),
                (ends[index] - starts[index]).map(units.duration),
                (starts[index] - window.start_ns).map(units.offset),
                part["correlation_id"].astype(str),
            ],
            axis=-1,
        )
        hover = (
            f"<b>%{{customdata[0]}}</b><br>{kind}, %{{customdata[1]}}<br>starts at %{{customdata[2]}}"
            "<br>correlation %{customdata[3]}<extra>%{y}</extra>"
        )
        figure.add_trace(
            go.Bar(
                x=np.maximum(length, pixel),  # a slice is drawn at least a pixel wide
                base=begin,
                y=labels[index],
                orientation="h",
                name=str(kind),
                marker=_marker(str(kind), part["name"]),
                width=0.8,
                text=slice_labels(part["name"].astype(str), length, window.width, short),
                textposition="inside",
                insidetextanchor="start",
                constraintext="inside",
                textfont={"size": LABEL_FONT_PX, "color": _label_color(str(kind))},
                customdata=details,
                hovertemplate=hover,
            ),
            row=row,
            col=1,
        )


def slice_labels(names: pd.Series, lengths: np.ndarray, width: float, short: Mapping[str, str]) -> list[str]:
    """Each slice's short name (the one every table and chart shows), cut at its end with … to the
    characters the slice can hold; "" for a slice too narrow for a few (Perfetto and Nsight Systems
    label slices so). Plotly hides whatever still does not fit."""
    room = np.asarray(lengths, dtype=float) / max(width, 1e-12) * TIMELINE_PX / LABEL_CHAR_PX
    return [
        html.escape(cut(short[name], int(chars))) if chars >= MIN_LABEL_CHARS else ""
        for name, chars in zip(names, room, strict=True)
    ]


def cut(label: str, chars: int) -> str:
    return label if len(label) <= chars else label[: max(chars - 1, 1)] + "…"


def _label_color(kind: str) -> str:
    return "#1f1f1f" if kind in RANGE_KINDS or kind in ("memset", "memcpy") else "#ffffff"


def _marker(kind: str, names: pd.Series) -> dict[str, object]:
    """Events in their kind's colour; ranges in a colour of their name's, hatched and outlined."""
    if kind not in RANGE_KINDS:
        return {"color": KIND_COLORS.get(kind, "#888"), "line": {"width": 0}}
    return {
        "color": [color_of(str(name), RANGE_PALETTE) for name in names],
        "line": {"width": 1, "color": RANGE_LINE},
        "pattern": {"shape": "/", "fgcolor": RANGE_LINE, "fgopacity": 0.35, "size": 6},
    }


def _add_busy_cells(
    figure: go.Figure, window: Window, lanes: pd.DataFrame, labels: pd.Series, order: list[str], row: int
) -> None:
    width_ns = int(lanes.attrs["bucket_ns"])
    start_ns = int(lanes.attrs["start_ns"])
    buckets = ((lanes["bucket_start_ns"].astype("int64") - start_ns) // width_ns).to_numpy()
    count = int(buckets.max()) + 1
    position = {label: i for i, label in enumerate(order)}
    rows_of = labels.map(position).to_numpy()
    busy = lanes["busy_ns"].to_numpy() / width_ns * 100
    shade = np.full((len(order), count), np.nan)
    shade[rows_of, buckets] = np.maximum(busy, 4)  # a bucket of instants stays visible
    details = np.full((len(order), count, 4), "", dtype=object)
    details[rows_of, buckets, 0] = [units.count(n) for n in lanes["events"]]
    details[rows_of, buckets, 1] = lanes["top_name"].astype(str).map(wrapped).to_numpy()
    details[rows_of, buckets, 2] = [units.percent(share) for share in busy]
    details[rows_of, buckets, 3] = [
        f"{units.offset(int(b) - window.start_ns)} to {units.offset(int(b) + width_ns - window.start_ns)}"
        for b in lanes["bucket_start_ns"].astype("int64")
    ]
    low, high = figure.get_subplot(row, 1).yaxis.domain
    figure.add_trace(
        go.Heatmap(
            z=shade,
            x0=float(window.offsets(np.array([start_ns + width_ns // 2]))[0]),
            dx=width_ns / window.unit_ns,
            y=order,
            zmin=0,
            zmax=100,
            colorscale="Blues",
            colorbar={
                "title": {"text": BUSY_TITLE, "side": "right"},
                "y": (low + high) / 2,
                "len": max(high - low, 0.15),
                "thickness": 12,
                "ticksuffix": " %",
            },
            customdata=details,
            hovertemplate="%{y}<br>%{customdata[3]}<br>%{customdata[0]} events, busy %{customdata[2]}"
            "<br>most time: %{customdata[1]}<extra></extra>",
        ),
        row=row,
        col=1,
    )


def bars(
    frame: pd.DataFrame, label: str, value: str, title: str, top: int = 20, labels: Mapping[str, str] | None = None
) -> go.Figure:
    """The `top` rows by |value|, largest on top; rows without a value are left out. A bar per
    full name, labelled with a short form unique in the chart (or the table's, from `labels`); the
    full name and the value in human units on hover; the value axis in one unit, named in `title`
    ("total time (ms)")."""
    frame = frame[frame[value].notna()]
    if frame.empty:
        return go.Figure()
    shown = frame.reindex(frame[value].abs().sort_values(ascending=False).index).head(top)
    names = distinct(shown[label].astype(str).tolist())
    own = unique_short_names(names, BAR_LABEL_WIDTH)
    short = {name: (labels or {}).get(name, own[name]) for name in names}
    kind = column_kind(value, shown[value])
    scale, unit = units.axis_scale(AXIS_UNITS.get(kind, ""), float(shown[value].abs().max()))
    read = formatter(kind)
    keys = [html.escape(name) for name in names]
    figure = go.Figure(
        go.Bar(
            x=shown[value] / scale,
            y=keys,
            orientation="h",
            marker={"color": _bar_colors(shown[value])},
            customdata=np.stack([[wrapped(name) for name in names], [read(v) for v in shown[value]]], axis=-1),
            hovertemplate="%{customdata[0]}<br><b>%{customdata[1]}</b><extra></extra>",
        )
    )
    figure.update_layout(
        height=140 + 22 * len(shown),
        yaxis={"autorange": "reversed", "tickmode": "array", "tickvals": keys,
               "ticktext": [html.escape(short[name]) for name in names]},
        xaxis={"title": {"text": html.escape(f"{title} ({unit})" if unit else title)},
               **_share_axis(kind, shown[value])},
        margin={"l": 10, "r": 10, "t": 20, "b": 40},
    )  # fmt: skip
    return figure


def _share_axis(kind: str, values: pd.Series) -> dict[str, Any]:
    """A share of a whole (busy %) on the whole's scale, 0 to 100 %: 2.7 % fills 2.7 % of the chart."""
    if kind != "percent" or not values.between(0, 100).all():
        return {}
    return {"range": [0, 100], "tickvals": [0, 20, 40, 60, 80, 100], "ticksuffix": " %"}


def _bar_colors(values: pd.Series) -> list[str] | str:
    """One colour for sizes; for changes (some below 0), less time green and more red."""
    signs = values.astype(float).fillna(0.0).tolist()
    if min(signs, default=0.0) >= 0:
        return PALETTE[0]
    return [LESS if v < 0 else MORE for v in signs]


def distinct(names: list[str]) -> list[str]:
    """The names with repeats told apart (" (2)"), so that no two rows share a bar."""
    seen: dict[str, int] = {}
    result = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        result.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return result


def wrapped(name: str) -> str:
    """A full name for a hover: escaped, broken into lines a screen can hold (past HOVER_CHARS, said cut)."""
    shown = name[:HOVER_CHARS]
    lines = [html.escape(shown[i : i + HOVER_LINE]) for i in range(0, len(shown), HOVER_LINE)]
    cut = f"<br>… ({len(name):,} characters in all)" if len(name) > HOVER_CHARS else ""
    return "<br>".join(lines) + cut


def xy(frame: pd.DataFrame, x: str, y: str, bar: bool = True) -> go.Figure:
    """One column against another, as bars or a line: a column of ns or bytes in one unit on its
    axis, instants (ns since the epoch) as times, both in human units on hover."""
    kinds = {column: column_kind(column, frame[column]) for column in (x, y)}
    scale, unit = units.axis_scale(AXIS_UNITS.get(kinds[y], ""), float(frame[y].abs().max()))
    xs = frame[x]
    if kinds[x] == "instant" and not pd.api.types.is_datetime64_any_dtype(xs.dtype):
        xs = pd.to_datetime(xs, unit="ns", utc=True)
    labels: dict[str, Any] = {}
    if not pd.api.types.is_numeric_dtype(xs.dtype) and not pd.api.types.is_datetime64_any_dtype(xs.dtype):
        raw = xs.astype(str)
        short = unique_short_names(raw, SQL_LABEL_WIDTH)
        xs = raw.map(html.escape)
        labels = {"tickmode": "array", "tickvals": list(xs), "ticktext": [html.escape(short[v]) for v in raw]}
    read_x, read_y = formatter(kinds[x]), formatter(kinds[y])
    details = np.stack([[html.escape(read_x(v)) for v in frame[x]], [read_y(v) for v in frame[y]]], axis=-1)
    hover = "%{customdata[0]}<br>%{customdata[1]}<extra></extra>"
    trace = go.Bar if bar else go.Scatter
    figure = go.Figure(trace(x=xs, y=frame[y] / scale, customdata=details, hovertemplate=hover))
    figure.update_layout(
        xaxis={"title": {"text": html.escape(header(x, kinds[x]))}, **labels},
        yaxis={"title": {"text": html.escape(f"{header(y, kinds[y])} ({unit})" if unit else header(y, kinds[y]))}},
        margin={"l": 10, "r": 10, "t": 20, "b": 40},
    )
    return figure
