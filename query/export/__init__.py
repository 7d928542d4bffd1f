"""A window of the store as a trace file that ui.perfetto.dev (and chrome://tracing) opens.

`window_trace(client, run=..., start=..., end=...)` fetches the window through the Query service
and returns Perfetto's protobuf or Chrome JSON; `fetch` and the pure writers (`perfetto_trace`,
`chrome_trace`, from query/export/perfetto.py and chrome.py) are there for callers that want the
parts (the CLI counts what it wrote).

Counters are the NVML series at the finest resolution the Query service answers (at most
MAX_POINTS buckets per series; a bucket holding one sample is that sample, at the bucket's start;
one holding several is their mean).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from query.client import Client
from query.export.chrome import chrome_trace
from query.export.perfetto import perfetto_trace
from query.export.window import NAMES, WindowData, window_data
from tracehouse.model import DEFAULT_LIMITS

WRITERS: Mapping[str, Callable[[WindowData], bytes]] = {"perfetto": perfetto_trace, "chrome": chrome_trace}
FORMATS = tuple(WRITERS)
PAGE = DEFAULT_LIMITS.max_page_size
MAX_POINTS = DEFAULT_LIMITS.max_points


def fetch(client: Client, *, run: str | None, host: str | None, start: int | None, end: int | None) -> WindowData:
    """Every event overlapping the window, the names of its processes and threads (for a run,
    named anywhere in the run), and every series of the window."""
    window: dict[str, Any] = {"run": run or None, "host": host or None, "start": start, "end": end}
    events = client.events(page_size=PAGE, **window)
    names = client.events(NAMES, page_size=PAGE, run=run, host=host or None) if run else events.iloc[:0]
    metrics = client.metrics(**window)
    series = [client.series(metric, max_points=MAX_POINTS, **window) for metric in sorted(set(metrics["metric"]))]
    return window_data(events, names, series)


def encode(data: WindowData, fmt: str = "perfetto") -> bytes:
    if fmt not in WRITERS:
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    return WRITERS[fmt](data)


def window_trace(
    client: Client, *, run: str | None, host: str | None, start: int | None, end: int | None, fmt: str = "perfetto"
) -> bytes:
    """The window as a trace: fmt "perfetto" (TracePacket protobuf) or "chrome" (trace-event JSON, UTF-8)."""
    if fmt not in WRITERS:
        raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    return encode(fetch(client, run=run, host=host, start=start, end=end), fmt)


__all__ = ["FORMATS", "WindowData", "chrome_trace", "encode", "fetch", "perfetto_trace", "window_trace"]
