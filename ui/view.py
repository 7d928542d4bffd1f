"""What a page shows, as it lives in the URL: run, host, window, metrics. Pure: query-string
values in, a resolved view out, and back.

A window is typed as text (ISO-8601, ns since the epoch, `now-5m`) so that a relative window
stays relative in a shared link; zooming and panning write absolute ns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tracehouse.timefmt import NS_PER_S, format_ns, parse_duration, parse_time

PRESETS = {"last 5 min": "5m", "last 15 min": "15m", "last 1 h": "1h", "last 6 h": "6h", "last 24 h": "24h"}
DEFAULT_PRESET = "15m"
DEFAULT_METRICS = ("gpu.util_pct",)
NO_METRICS = "none"
LAST_NS = 2**63 - 1  # int64 ns since the epoch: the store's range (1970 to 2262)
MIN_WIDTH_NS = 1_000  # zooming stops at a microsecond


class ViewError(ValueError):
    """A URL parameter that does not parse; the message names it."""


@dataclass(frozen=True)
class RunBounds:
    start_ns: int
    end_ns: int | None  # None while the run is open


@dataclass(frozen=True)
class View:
    """The parameters as typed (text), before they are resolved against a clock and a run."""

    run: str = ""
    host: str = ""
    start: str = ""  # URL `from`
    end: str = ""  # URL `to`
    last: str = ""  # a preset: the window is [now - last, now)
    metrics: tuple[str, ...] = DEFAULT_METRICS
    job: str = ""  # the run is a rank of this job: its peers' lanes are drawn below its own,
    step: str = ""  # at this step (the peers nearest in step time there, unless `peers` names them),
    peers: str = ""  # "0,3,7", or "none" (ui/peers.py)

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> View:
        text = params.get("metrics", "")
        metrics = tuple(m for m in text.split(",") if m) if text and text != NO_METRICS else DEFAULT_METRICS
        if text == NO_METRICS:
            metrics = ()
        return cls(
            run=params.get("run", ""),
            host=params.get("host", ""),
            start=params.get("from", ""),
            end=params.get("to", ""),
            last=params.get("last", ""),
            metrics=metrics,
            job=params.get("job", ""),
            step=params.get("step", ""),
            peers=params.get("peers", ""),
        )

    def params(self) -> dict[str, str]:
        values = {"run": self.run, "host": self.host, "from": self.start, "to": self.end, "last": self.last,
                  "job": self.job, "step": self.step, "peers": self.peers}  # fmt: skip
        if self.metrics != DEFAULT_METRICS:
            values["metrics"] = ",".join(self.metrics) or NO_METRICS
        return {key: value for key, value in values.items() if value}

    def with_window(self, start_ns: int, end_ns: int) -> View:
        return replace(self, start=str(start_ns), end=str(end_ns), last="")

    def with_preset(self, last: str) -> View:
        return replace(self, start="", end="", last=last)

    def window(self, now_ns: int, run: RunBounds | None) -> tuple[int, int]:
        """[start, end) in ns. Typed bounds win; then a preset; then the run's span; then the
        default preset."""
        if self.start or self.end:
            start = _time("from", self.start, now_ns) if self.start else None
            end = _time("to", self.end, now_ns) if self.end else None
            if start is None:
                start = run.start_ns if run else (end or now_ns) - parse_duration(DEFAULT_PRESET)
            if end is None:
                end = run.end_ns if run and run.end_ns is not None else now_ns
        elif self.last:
            end = now_ns
            start = end - _duration("last", self.last)
        elif run is not None:
            start, end = run.start_ns, run.end_ns if run.end_ns is not None else now_ns
        else:
            end = now_ns
            start = end - parse_duration(DEFAULT_PRESET)
        for field, value in (("from", start), ("to", end)):
            if not 0 <= value <= LAST_NS:
                raise ViewError(f"{field}: {value} ns is outside 1970 to 2262, the times a store can hold")
        if end <= start:
            raise ViewError(f"window: 'to' ({format_ns(end)}) must come after 'from' ({format_ns(start)})")
        return start, end


def _time(field: str, text: str, now_ns: int) -> int:
    try:
        return parse_time(text, now=now_ns)
    except ValueError as error:
        raise ViewError(f"{field}: {error}") from None


def _duration(field: str, text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise ViewError(f"{field}: {error}") from None


def inside(start_ns: int, end_ns: int) -> tuple[int, int]:
    """The window at least MIN_WIDTH_NS wide and moved, whole, into [0, LAST_NS]: a relative-time
    run starts at 0, and panning past either end keeps the width."""
    width = min(max(end_ns - start_ns, MIN_WIDTH_NS), LAST_NS)
    if end_ns - start_ns < width:
        start_ns = (start_ns + end_ns) // 2 - width // 2
    start_ns = min(max(start_ns, 0), LAST_NS - width)
    return start_ns, start_ns + width


def zoom(start_ns: int, end_ns: int, factor: float) -> tuple[int, int]:
    """The window scaled about its middle: factor 2 shows twice the time."""
    middle = (start_ns + end_ns) // 2
    half = round((end_ns - start_ns) * factor / 2)
    return inside(middle - half, middle + half)


def pan(start_ns: int, end_ns: int, share: float) -> tuple[int, int]:
    """The window moved by a share of its width (negative: earlier)."""
    shift = round((end_ns - start_ns) * share)
    return inside(start_ns + shift, end_ns + shift)


def selected(start_ns: int, x0: float, x1: float, unit_ns: float = NS_PER_S) -> tuple[int, int]:
    """A box selection on the time axis (offsets from the window's start, in units of `unit_ns`)
    as a window."""
    low, high = sorted((x0, x1))
    return inside(start_ns + round(low * unit_ns), start_ns + round(high * unit_ns))
