"""A window's contents as the trace writers take them (pure): events with integer-ns times, the
names of processes and threads, counter values, and where each event goes — the track of its GPU
stream or of its thread and family, with events that do not nest moved to a further track."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracehouse.units import metric_unit

ON_GPU = frozenset({"kernel", "memcpy", "memset", "sync", "gpu_annotation"})  # on a GPU stream when it has one
NAMES = ("process", "thread")  # kinds that only name a process or a thread
FAMILIES: Mapping[str, str] = {  # a track per thread and family, named so
    "cuda_api": "CUDA API",
    "sync": "CUDA sync",
    "nvtx": "NVTX",
    "osrt": "OS runtime",
    "cudnn": "cuDNN",
    "cublas": "cuBLAS",
    "cpu_op": "CPU ops",
    "python": "Python",
    "step": "steps & phases",
    "phase": "steps & phases",
    "mark": "marks",
    "gpu_annotation": "annotations",
}
EVENT_COLUMNS = (
    "host", "kind", "start", "end", "gpu", "stream", "pid", "tid", "name", "correlation_id", "bytes", "extras",
)  # fmt: skip
COUNTER_COLUMNS = ("host", "gpu", "pid", "metric", "ts", "value")


@dataclass(frozen=True)
class WindowData:
    """events: EVENT_COLUMNS, start/end in ns, sorted by start (no process/thread rows);
    counters: COUNTER_COLUMNS, ts in ns; names of processes (host, pid) and threads (host, pid, tid)."""

    events: pd.DataFrame
    counters: pd.DataFrame
    processes: dict[tuple[str, int], str] = field(default_factory=dict)
    threads: dict[tuple[str, int, int], str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.events.empty and self.counters.empty


def _ns(column: pd.Series) -> np.ndarray:
    if isinstance(column.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_any_dtype(column):
        return column.astype("int64").to_numpy()
    return column.to_numpy(dtype=np.int64)


def window_data(events: pd.DataFrame, names: pd.DataFrame, series: Iterable[pd.DataFrame]) -> WindowData:
    """From the Client's frames: events (Client.events), the events that name processes and
    threads, and Client.series answers (one value per bucket: its mean, at its start)."""
    namers = pd.concat([names, events[events["kind"].isin(NAMES)]]) if len(events) else names
    rows = zip(*(namers[c].tolist() for c in ("kind", "host", "pid", "tid", "name")), strict=True)
    processes: dict[tuple[str, int], str] = {}
    threads: dict[tuple[str, int, int], str] = {}
    for kind, host, pid, tid, name in rows:
        if name and kind == "process":
            processes[(host, pid)] = name
        elif name and kind == "thread":
            threads[(host, pid, tid)] = name
    kept = events[~events["kind"].isin(NAMES)] if len(events) else events.iloc[:0]
    frame = pd.DataFrame({c: kept[c].to_numpy() if c in kept else [] for c in EVENT_COLUMNS})
    frame["start"], frame["end"] = _ns(frame["start"]), _ns(frame["end"])
    for column in ("gpu", "stream", "pid", "tid", "correlation_id", "bytes"):
        frame[column] = frame[column].to_numpy(dtype=np.int64)
    frame = frame.sort_values(["start", "end"], ascending=[True, False], kind="stable").reset_index(drop=True)
    parts = [
        pd.DataFrame(
            {
                "host": s["host"].astype(str),
                "gpu": s["gpu"].to_numpy(dtype=np.int64),
                "pid": s["pid"].to_numpy(dtype=np.int64),
                "metric": s["metric"].astype(str),
                "ts": _ns(s["bucket_start"]),
                "value": s["avg"].to_numpy(dtype=np.float64),
            }
        )
        for s in series
        if len(s)
    ]
    counters = pd.concat(parts, ignore_index=True) if parts else _empty_counters()
    counters = counters[np.isfinite(counters["value"].to_numpy(dtype=np.float64))].reset_index(drop=True)
    return WindowData(frame, counters, processes, threads)


def _empty_counters() -> pd.DataFrame:
    frame = pd.DataFrame({c: np.array([], dtype=np.int64) for c in COUNTER_COLUMNS})
    return frame.astype({"host": str, "metric": str, "value": np.float64})


# -- where things go ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """A GPU, a process or a host: tracks are shown under it. pid is set for a process."""

    key: tuple[object, ...]
    name: str
    pid: int | None = None


@dataclass(frozen=True)
class Track:
    """Slices of one GPU stream, or of one thread and family (layer > 0: what did not nest in the
    layers before); or a counter series (unit set)."""

    key: tuple[object, ...]
    group: tuple[object, ...]
    name: str
    unit: str | None = None


@dataclass(frozen=True)
class Layout:
    groups: list[Group]
    tracks: list[Track]  # in display order within each group
    event_track: np.ndarray  # index into tracks, per event row
    counter_track: np.ndarray  # index into tracks, per counter row


def on_gpu(events: pd.DataFrame) -> np.ndarray:
    """Rows drawn on their GPU stream rather than on a thread."""
    return events["kind"].isin(ON_GPU).to_numpy() & (events["gpu"].to_numpy() >= 0) & (events["stream"].to_numpy() >= 0)


def gpu_name(host: str, gpu: int, hosts: int) -> str:
    return f"GPU {gpu}" if hosts <= 1 else f"{host} · GPU {gpu}"


def counter_name(host: str, gpu: int, pid: int, metric: str, hosts: int) -> str:
    scope = gpu_name(host, gpu, hosts) if gpu >= 0 else host or "host"
    return f"{scope} · pid {pid} · {metric}" if pid > 0 else f"{scope} · {metric}"


def layers(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per interval (sorted by start, then longest first), the first layer where it nests
    properly among the intervals already placed: one track per layer draws them all. Instants
    (end == start) nest anywhere: layer 0."""
    stacks: list[list[int]] = []
    out = np.zeros(len(starts), dtype=np.int64)
    for row, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if end == start:
            continue
        for layer, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                out[row] = layer
                break
        else:
            stacks.append([end])
            out[row] = len(stacks) - 1
    return out


def layout(data: WindowData) -> Layout:
    events, counters = data.events, data.counters
    hosts = len(set(events["host"]) | set(counters["host"]))
    gpu_rows = on_gpu(events)
    keys: list[tuple[object, ...]] = []
    for row, (host, kind, gpu, stream, pid, tid) in enumerate(
        zip(*(events[c].tolist() for c in ("host", "kind", "gpu", "stream", "pid", "tid")), strict=True)
    ):
        if gpu_rows[row]:
            family = "annotations" if kind == "gpu_annotation" else "sync" if kind == "sync" else ""
            keys.append(("gpu", host, gpu, stream, family))
        else:
            keys.append(("thread", host, pid, tid, FAMILIES.get(kind, kind)))
    frame = pd.DataFrame({"key": keys, "start": events["start"], "end": events["end"]})
    frame["layer"] = 0
    for _, rows in frame.groupby("key", sort=False):
        frame.loc[rows.index, "layer"] = layers(rows["start"].to_numpy(), rows["end"].to_numpy())
    groups: dict[tuple[object, ...], Group] = {}
    tracks: dict[tuple[object, ...], Track] = {}

    def group_of(host: str, gpu: int, pid: int) -> tuple[object, ...]:
        if gpu >= 0:
            key: tuple[object, ...] = ("gpu", host, gpu)
            groups.setdefault(key, Group(key, gpu_name(host, gpu, hosts)))
        elif pid > 0:
            key = ("process", host, pid)
            name = data.processes.get((host, pid), f"process {pid}")
            groups.setdefault(key, Group(key, name if hosts <= 1 else f"{host} · {name}", pid))
        else:
            key = ("host", host)
            groups.setdefault(key, Group(key, host or "host"))
        return key

    for key, layer in sorted(set(zip(frame["key"], frame["layer"], strict=True)), key=_track_order):
        what, host, a, b, family = key
        if what == "gpu":
            name = f"{gpu_name(host, a, hosts)} · stream {b}" + (f" · {family}" if family else "")
            group = group_of(host, a, 0)
        else:
            thread = data.threads.get((host, a, b), f"thread {b}")
            name = f"{thread} ({b}) · {family}" if b else f"{family}"
            group = group_of(host, -1, a)
        tracks[(*key, layer)] = Track((*key, layer), group, name + (f" ({layer + 1})" if layer else ""))
    series = counters[["host", "gpu", "pid", "metric"]].drop_duplicates().sort_values(["host", "gpu", "pid", "metric"])
    for host, gpu, pid, metric in series.itertuples(index=False):
        key = ("counter", host, gpu, pid, metric)
        name = counter_name(host, gpu, pid, metric, hosts)
        tracks[key] = Track(key, group_of(host, gpu, 0), name, metric_unit(metric))
    index = {key: i for i, key in enumerate(tracks)}
    event_track = np.array(
        [index[(*k, layer)] for k, layer in zip(frame["key"], frame["layer"], strict=True)], dtype=np.int64
    )
    counter_track = np.array(
        [
            index[("counter", *k)]
            for k in zip(counters["host"], counters["gpu"], counters["pid"], counters["metric"], strict=True)
        ],
        dtype=np.int64,
    )
    ordered = sorted(groups.values(), key=lambda g: ({"gpu": 0, "process": 1, "host": 2}[str(g.key[0])], g.key[1:]))
    return Layout(ordered, list(tracks.values()), event_track, counter_track)


def _track_order(item: tuple[tuple[object, ...], int]) -> tuple[object, ...]:
    key, layer = item
    return (str(key[0]), str(key[1]), key[2], key[3], str(key[4]), layer)


def flows(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Flow ids from each CUDA call to the first GPU work it launched in the window (same host,
    process and correlation id): (out per row, in per row), 0 where none."""
    out = np.zeros(len(events), dtype=np.int64)
    into = np.zeros(len(events), dtype=np.int64)
    if events.empty:
        return out, into
    frame = events[["host", "kind", "pid", "correlation_id"]].reset_index(drop=True)
    frame["row"] = np.arange(len(frame))
    linked = frame[(frame["correlation_id"] > 0) & (frame["pid"] > 0)]
    calls = linked[linked["kind"] == "cuda_api"].drop_duplicates(["host", "pid", "correlation_id"])
    work = linked[linked["kind"].isin(("kernel", "memcpy", "memset")) & on_gpu(events)[linked["row"]]]
    work = work.drop_duplicates(["host", "pid", "correlation_id"])
    pairs = calls.merge(work, on=["host", "pid", "correlation_id"], suffixes=("_call", "_work"))
    ids = np.arange(1, len(pairs) + 1, dtype=np.int64)
    out[pairs["row_call"].to_numpy()] = ids
    into[pairs["row_work"].to_numpy()] = ids
    return out, into
