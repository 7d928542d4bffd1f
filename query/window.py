"""Which rows a question is about, and the SQL predicates that select them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracehouse.model import Limits
from tracehouse.requesterrors import QueryError


@dataclass(frozen=True)
class Window:
    run_id: str = ""
    hosts: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    from_ns: int | None = None
    to_ns: int | None = None

    def check(self, limits: Limits) -> Window:
        for name in ("from_ns", "to_ns"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise QueryError(f"window.{name}", f"{value} is before 1970; times are ns since the Unix epoch")
        if self.from_ns is not None and self.to_ns is not None and self.to_ns <= self.from_ns:
            raise QueryError("window.to_ns", f"{self.to_ns} is not after from_ns {self.from_ns}")
        for gpu in self.gpus:
            if not -1 <= gpu <= limits.max_gpu_index:
                raise QueryError("window.gpus", f"{gpu} is not a GPU index")
        for host in self.hosts:
            if not host or len(host) > limits.max_name_bytes:
                raise QueryError("window.hosts", f"{host[:64]!r} is not a host name")
        if len(self.run_id) > limits.max_id_bytes:
            raise QueryError("window.run_id", "too long")
        return self


@dataclass(frozen=True)
class RunSpan:
    """Where a run lies: its host and time span (end None while open)."""

    run_id: str
    host: str
    start: int
    end: int | None
    relative_time: bool


@dataclass
class Predicates:
    """WHERE clauses and their server-side bound parameters."""

    clauses: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def add(self, clause: str, **params: Any) -> None:
        self.clauses.append(clause)
        self.params.update(params)

    def sql(self) -> str:
        return " AND ".join(self.clauses) if self.clauses else "1"


def ns(param: str) -> str:
    """SQL for a bound Int64 parameter of ns since the epoch, as DateTime64(9)."""
    return f"fromUnixTimestamp64Nano({{{param}:Int64}}, 'UTC')"


# Rows of an import still under way are in no answer (see Run.importing).
COMPLETE = "run_id NOT IN (SELECT run_id FROM {db}.runs FINAL WHERE importing)"


def _common(window: Window, where: Predicates) -> None:
    where.add(COMPLETE)
    if window.hosts:
        where.add("host IN {hosts:Array(String)}", hosts=list(window.hosts))
    if window.gpus:
        where.add("gpu IN {gpus:Array(Int16)}", gpus=list(window.gpus))


def run_window(run: RunSpan) -> tuple[int | None, int | None]:
    """A run's window, the one every answer and page uses: [start, end) as the run was recorded (end None
    while it is open). A run without a wall clock (relative_time) is no exception: its start and end
    count from its own origin, as its rows do. Busy % over a run is over this, not over the span of its
    GPU work (compare's and gpu-time's alike). Rows naming a run nobody described (no host, no end) have
    no window of their own: (None, None)."""
    if run.relative_time and run.end is None and not run.host:
        return None, None
    return run.start, run.end


def bounds(window: Window, run: RunSpan | None) -> tuple[int | None, int | None]:
    """The window's time span, narrowed to the run's (run_window)."""
    start, end = window.from_ns, window.to_ns
    if run is not None:
        run_start, run_end = run_window(run)
        if run_start is not None:
            start = run_start if start is None else max(start, run_start)
        if run_end is not None:
            end = run_end if end is None else min(end, run_end)
    return start, end


def sample_predicates(window: Window, run: RunSpan | None, times: bool = True) -> Predicates:
    """Samples in the window: a run's own samples, and its host's telemetry during the run.
    Without `times`, only the series it selects: which host, GPU and run."""
    where = Predicates()
    if run is not None:
        if run.relative_time:
            where.add("run_id = {run_id:String}", run_id=run.run_id)
        else:
            where.add("host = {run_host:String}", run_host=run.host)
    _common(window, where)
    if not times:
        return where
    start, end = bounds(window, run)
    if start is not None:
        where.add(f"ts >= {ns('from_ns')}", from_ns=start)
    if end is not None:
        where.add(f"ts < {ns('to_ns')}", to_ns=end)
    return where


def event_predicates(window: Window, run: RunSpan | None) -> Predicates:
    """Events overlapping the window: [start, end) meets [from, to); an instant counts
    when it lies in the window."""
    where = Predicates()
    if run is not None:
        where.add("run_id = {run_id:String}", run_id=run.run_id)
    _common(window, where)
    if window.to_ns is not None:
        where.add(f"start < {ns('to_ns')}", to_ns=window.to_ns)
    if window.from_ns is not None:
        where.add(f"end >= {ns('from_ns')} AND (end > {ns('from_ns')} OR end = start)", from_ns=window.from_ns)
    return where


def run_named() -> str:
    """Runs called {name:String}, newest first: a window may name its run so where one run has the name."""
    return """
SELECT run_id, host, toUnixTimestamp64Nano(start) AS start_ns
FROM {db}.runs FINAL WHERE name = {name:String} AND NOT importing ORDER BY start DESC, run_id LIMIT {limit:UInt32}
"""


def runs_named_like() -> str:
    """The names of at most {limit:UInt32} runs nearest {name:String} by edit distance (case aside), within
    {most:UInt32} edits: what a misspelt run name was meant to be."""
    return """
SELECT name, min(editDistance(lower(name), lower({name:String}))) AS distance
FROM {db}.runs FINAL WHERE NOT importing AND name != ''
GROUP BY name HAVING distance <= {most:UInt32} ORDER BY distance, name LIMIT {limit:UInt32}
"""


def names(field: str, values: Sequence[str], limits: Limits) -> list[str]:
    for value in values:
        if not value or len(value) > limits.max_string_bytes:
            raise QueryError(field, f"{value[:64]!r} is not a name")
    return list(values)
