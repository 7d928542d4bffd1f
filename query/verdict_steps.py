"""Per-step figures of one run, from its steps, its GPU work and its telemetry. Pure numpy.

A step's time splits into parts that add up to it exactly, per GPU that worked in the run, then
averaged over those GPUs: the GPU's busy time (the union of its kernels and memory operations
inside the step) shared among the names that ran in proportion to their time inside the step
(overlapping work shares the time it overlaps; without overlap each gets its own time), and its
idle time, split into the time the host was inside a CUDA API call (launching, synchronising,
copying: CPU-side API time) and the rest (the host elsewhere: data loading, Python, I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tracehouse.units import duration

IDLE_IN_API = "GPU idle, host in CUDA API"
IDLE_ELSEWHERE = "GPU idle, host elsewhere"
MEMORY_PARTS = {"memcpy": "memory copies", "memset": "memory sets"}
MAX_PARTS = 100  # part names kept per comparison (by total time); the rest are summed as OTHER
OTHER = "other kernels"


@dataclass(frozen=True)
class Steps:
    """A run's steps, [start, end) ns in time order, and where they came from."""

    starts: np.ndarray
    ends: np.ndarray
    source: str  # "steps", "NVTX ranges matching ...", or "12 windows of 8.5 s"
    thread: tuple[int, int] | None = None  # (pid, tid) the steps ran on; None for windows
    windows: bool = False  # windows cut from the run, not its steps

    def after(self, dropped: int) -> Steps:
        """The steps past the first `dropped`."""
        return Steps(self.starts[dropped:], self.ends[dropped:], self.source, self.thread, self.windows)

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts


@dataclass(frozen=True)
class Work:
    """A run's GPU work and CUDA API calls: intervals in ns, each work item's GPU and part label."""

    starts: np.ndarray
    ends: np.ndarray
    gpus: np.ndarray
    labels: np.ndarray  # int codes into names
    names: Sequence[str]
    api_starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    api_ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def outermost(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which intervals (sorted by start) are not inside an earlier one: nested step-like ranges count once."""
    if not len(starts):
        return np.zeros(0, dtype=bool)
    reach = np.maximum.accumulate(ends)
    keep = np.ones(len(starts), dtype=bool)
    keep[1:] = starts[1:] >= reach[:-1]
    return keep


def windows(start: int, end: int, width: int, most: int = 100_000) -> Steps:
    """[start, end) cut into equal windows about `width` ns long (at most `most`), that cover it
    whole: none of the run is left out, so no work is (a last partial window would leave out the
    run's tail, and the work in it)."""
    span = end - start
    if span <= 0:
        return Steps(np.zeros(0, np.int64), np.zeros(0, np.int64), f"windows of {duration(width)}", windows=True)
    count = int(min(most, max(1, round(span / width))))
    index = np.arange(count + 1, dtype=np.int64)
    quotient, remainder = divmod(span, count)
    edges = start + index * quotient + (index * remainder) // count  # exact: no float on epoch ns
    plural = "s" if count > 1 else ""
    return Steps(edges[:-1], edges[1:], f"{count} window{plural} of {duration(span / count)}", windows=True)


def _segments(steps: Steps, bounds: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Time inside steps, cut where any interval of the given sets begins or ends: per segment its
    step, length and, per set, whether some interval of the set covers it."""
    times = [steps.starts, steps.ends, *(t for pair in bounds for t in pair)]
    cut = np.unique(np.concatenate(times))
    if len(cut) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), *[np.zeros(0, bool) for _ in bounds]
    left, length = cut[:-1], np.diff(cut)
    covered = []
    for s, e in bounds:
        depth = np.zeros(len(cut), dtype=np.int64)
        np.add.at(depth, np.searchsorted(cut, s), 1)
        np.add.at(depth, np.searchsorted(cut, e), -1)
        covered.append(np.cumsum(depth)[:-1] > 0)
    step = np.searchsorted(steps.starts, left, side="right") - 1
    inside = (step >= 0) & (left < steps.ends[np.maximum(step, 0)])
    return step[inside], length[inside], *[c[inside] for c in covered]


def step_parts(steps: Steps, work: Work) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per step: the parts of its time (name -> ns per step, averaged over the GPUs that worked;
    they add up to the step's time) and the GPU busy ns (averaged likewise). No GPU work: no parts."""
    n = len(steps.starts)
    gpus = np.unique(work.gpus)
    if not len(gpus) or not n:
        return {}, np.zeros(n)
    parts: dict[str, np.ndarray] = {}
    busy_total = np.zeros(n)

    def add(name: str, values: np.ndarray) -> None:
        parts[name] = parts.get(name, np.zeros(n)) + values / len(gpus)

    for gpu in gpus:
        mine = work.gpus == gpu
        s, e, labels = work.starts[mine], work.ends[mine], work.labels[mine]
        step, length, busy, api = _segments(steps, [(s, e), (work.api_starts, work.api_ends)])
        busy_ns = np.bincount(step, weights=length * busy, minlength=n)
        add(IDLE_IN_API, np.bincount(step, weights=length * (~busy & api), minlength=n))
        add(IDLE_ELSEWHERE, np.bincount(step, weights=length * (~busy & ~api), minlength=n))
        busy_total += busy_ns / len(gpus)
        own = _own_time(steps, s, e, labels, len(work.names))  # (n, names): each name's time inside each step
        total = own.sum(axis=1)
        share = np.divide(busy_ns, total, out=np.zeros(n), where=total > 0)
        for code in np.flatnonzero(own.any(axis=0)):
            add(work.names[int(code)], own[:, code] * share)
    return parts, busy_total


def _own_time(steps: Steps, s: np.ndarray, e: np.ndarray, labels: np.ndarray, names: int) -> np.ndarray:
    """(steps, names): the time of each label's work inside each step, work clipped to the steps it meets."""
    n = len(steps.starts)
    out = np.zeros((n, names))
    first = np.searchsorted(steps.ends, s, side="right")  # the first step ending after s
    last = np.searchsorted(steps.starts, e, side="left") - 1  # the last step starting before e
    for offset in range(int(np.max(last - first, initial=-1)) + 1):  # work spans one step, rarely more
        step = first + offset
        meets = step <= last
        k = step[meets]
        clipped = np.minimum(e[meets], steps.ends[k]) - np.maximum(s[meets], steps.starts[k])
        np.add.at(out, (k, labels[meets]), np.maximum(clipped, 0))
    return out


OUTSIDE_PHASES = "outside phases"


@dataclass(frozen=True)
class Phases:
    """The phases inside a run's steps: [start, end), name and step index, in time order."""

    starts: np.ndarray
    ends: np.ndarray
    names: np.ndarray
    step: np.ndarray


def phases_inside(steps: Steps, starts: np.ndarray, ends: np.ndarray, names: np.ndarray) -> Phases:
    """Ranges of the steps' thread (sorted by start) that lie inside one step and are not the step
    itself; of nested ones, the outermost."""
    step = np.searchsorted(steps.starts, starts, side="right") - 1
    safe = np.maximum(step, 0)
    inside = (step >= 0) & (ends <= steps.ends[safe]) & ~((starts == steps.starts[safe]) & (ends == steps.ends[safe]))
    starts, ends, names, step = starts[inside], ends[inside], names[inside], step[inside]
    keep = outermost(starts, ends)
    return Phases(starts[keep], ends[keep], names[keep], step[keep])


def _per_name(n: int, names: np.ndarray, step: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    return {str(name): np.bincount(step[names == name], weights=values[names == name], minlength=n)
            for name in np.unique(names)}  # fmt: skip


def phase_parts(steps: Steps, phases: Phases) -> dict[str, np.ndarray]:
    """Per step, the time of each phase inside it and the rest, OUTSIDE_PHASES: they add up to the
    step's time. No phase inside any step: none."""
    if not len(phases.starts):
        return {}
    parts = _per_name(len(steps.starts), phases.names, phases.step, (phases.ends - phases.starts).astype(np.float64))
    parts[OUTSIDE_PHASES] = steps.lengths - np.sum(list(parts.values()), axis=0)
    return parts


def launched_by_phase(steps: Steps, phases: Phases, launches: np.ndarray, gpu_ns: np.ndarray) -> dict[str, np.ndarray]:
    """Per step, the GPU time of the work launched from each phase (its launching call's start
    inside the phase, on the steps' thread; `launches` of that thread's work only), and of the work
    launched inside the step but outside its phases (OUTSIDE_PHASES). None without phases."""
    n = len(steps.starts)
    if not len(phases.starts) or not len(launches):
        return {}
    step = np.searchsorted(steps.starts, launches, side="right") - 1
    inside = (step >= 0) & (launches < steps.ends[np.maximum(step, 0)])
    launches, gpu_ns, step = launches[inside], gpu_ns[inside].astype(np.float64), step[inside]
    phase = np.searchsorted(phases.starts, launches, side="right") - 1
    within = (phase >= 0) & (launches < phases.ends[np.maximum(phase, 0)])
    names = np.where(within, phases.names[np.maximum(phase, 0)], OUTSIDE_PHASES)
    return _per_name(n, names, step, gpu_ns)


def counter_rise(steps: Steps, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per step, the rise of a cumulative counter (one GPU's energy) across it, read between its
    samples by linear interpolation; NaN for a step outside the samples or across a reset."""
    if len(times) < 2:
        return np.full(len(steps.starts), np.nan)
    at_start = np.interp(steps.starts, times, values, left=np.nan, right=np.nan)
    at_end = np.interp(steps.ends, times, values, left=np.nan, right=np.nan)
    rise = at_end - at_start
    return np.where(rise >= 0, rise, np.nan)


def mean_inside(steps: Steps, times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per step, the mean of the samples inside it; NaN where none is."""
    n = len(steps.starts)
    step = np.searchsorted(steps.starts, times, side="right") - 1
    inside = (step >= 0) & (times < steps.ends[np.maximum(step, 0)])
    total = np.bincount(step[inside], weights=values[inside], minlength=n)
    count = np.bincount(step[inside], minlength=n)
    return np.divide(total, count, out=np.full(n, np.nan), where=count > 0)
