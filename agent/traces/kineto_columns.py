"""Kineto events mapped to rows a window at a time, column-wise (agent/traces/kineto_events.py maps
them one at a time, with the same result).

A window is the events of a block that surely fit in the current chunk (no more than it has room
for). Each member is taken out of the window's events once, as a list; the kind of each event is
a dict lookup of its phase and category; times become ns in numpy under to_ns's exactness rule (a
float's ns value only where it is provably not near a half, an int only where its ns value is one
that a float holds exactly); ids, names and args are checked as the per-event code checks them.
An event that any check does not prove plain (a Decimal or a string where a number is expected,
a time out of range, a name to cut, a metadata event, an unknown category, an item that is not
an object...) goes to the per-event code in its place in the file; the plain events between two
such (a run) become rows at once. Only what is sequential loops over rows, and only over the rows
that need it: the lanes of ranges and ops (depth), and CUDA calls with the GPU work they launch
(links). The first flow of a window goes through the per-event code when no flow has been
counted yet, so that skip reasons are counted in the order they appear (MAX_REASONS)."""

from __future__ import annotations

import contextlib
import math
from decimal import Decimal
from typing import Any

import numpy as np

from agent.traces.kineto_blocks import Event
from agent.traces.kineto_events import (
    _EMPTY,
    CATEGORIES,
    CHUNK_ROWS,
    GPU_WORK,
    MAX_EVENT_BYTES,
    MAX_EVENT_NS,
    MAX_GPU,
    MAX_NS,
    MAX_STRING,
    STEP_PREFIX,
    UINT32,
    EventRows,
    _out_of_range,
    fit_string,
    message_bytes,
    number_text,
    uint_below,
)
from tracehouse.model import NO_GPU, NO_STREAM

MIN_WINDOW = 32  # fewer events than this (or less room) are mapped one at a time
FLOW = "(flow)"
_X_KINDS: dict[Any, str] = dict(CATEGORIES)
_PHASE_KINDS: dict[Any, str] = {"i": "mark", "I": "mark", "s": FLOW, "t": FLOW, "f": FLOW}
# kind -> code; 0: not proved plain, 1: a flow, 2..6 on a host thread, 7.. on the GPU
_CODES: dict[Any, int] = {
    None: 0, FLOW: 1, "mark": 2, "cpu_op": 3, "python": 4, "nvtx": 5, "cuda_api": 6,
    "kernel": 7, "memcpy": 8, "memset": 9, "sync": 10, "gpu_annotation": 11,
}  # fmt: skip
_MARK, _NVTX, _CUDA_API, _GPU, _GPU_ANNOTATION = 2, 5, 6, 7, 11
_LANE_FAMILIES = {"cpu_op": "cpu_op", "python": "python", "nvtx": "range", "step": "range", "gpu_annotation": "gpu"}
_PLAIN_NUMBERS = frozenset({float, int, type(None)})
_FLOAT_EXACT = float(1 << 52)
_INT_EXACT = 1 << 53
_EVENT = frozenset({Event})


def ns_column(values: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """µs values to ns as to_ns makes them, where that is proved without Decimal: (ns, proved,
    absent); ns is 0 where not proved, absent says None."""
    floats = None
    if set(map(type, values)) <= _PLAIN_NUMBERS:
        with contextlib.suppress(OverflowError):  # an int beyond floats: checked one by one
            floats = np.array(values, np.float64)  # None is nan: a JSON number never is
    if floats is None:
        floats = np.array(
            [v if type(v) is float or (type(v) is int and -_INT_EXACT < v < _INT_EXACT) else math.nan for v in values],
            np.float64,
        )
        absent = np.array([v is None for v in values], bool)
    else:
        absent = np.isnan(floats)
    ns = floats * 1000.0
    nearest = np.rint(ns)
    size = np.abs(ns)
    proved = (size < _FLOAT_EXACT) & (np.abs(ns - nearest) + size * 2.0**-50 < 0.5)
    return np.where(proved, nearest, 0.0).astype(np.int64), proved, absent


def id_column(values: list[Any], end: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids in [0, end) as int64 (0 elsewhere), and where they are."""
    if set(map(type, values)) == {int}:
        try:
            ids = np.array(values, np.int64)
        except OverflowError:
            pass
        else:
            inside = ids >= 0
            return ids, (inside & (ids < end) if end <= 1 << 62 else inside)
    inside_list = [type(v) is int and 0 <= v < end for v in values]
    return np.array([v if k else 0 for v, k in zip(values, inside_list, strict=True)], np.int64), np.array(
        inside_list, bool
    )


def _correlation(args: Any) -> int:
    correlation = args.get("correlation") if type(args) is dict else None
    return correlation if type(correlation) is int and 0 <= correlation < 1 << 63 else 0


class ColumnRows(EventRows):
    """EventRows that maps windows of events column-wise (the module's docstring)."""

    def add_all(self, events: list[Any], at: int) -> int:
        count = len(events)
        while at < count:
            room = CHUNK_ROWS - self.current.count
            if room < MIN_WINDOW or count - at < MIN_WINDOW:
                return self.add_each(events, at)
            stop = min(count, at + room)
            self._window(events[at:stop])
            at = stop
        return at

    def _window(self, window: list[Any]) -> None:
        if set(map(type, window)) != _EVENT:
            self.add_each(window, 0)
            return
        try:
            kinds = [
                _X_KINDS.get(e.cat) if e.ph == "X" else _PHASE_KINDS.get(e.ph) for e in window
            ]  # TypeError: a phase or category that is not hashable
        except TypeError:
            self.add_each(window, 0)
            return
        if "flow" not in self.skipped and FLOW in kinds:
            kinds[kinds.index(FLOW)] = None
        plan = _Plan(self, window, kinds)
        done = 0
        for at in np.flatnonzero(plan.uneven).tolist():
            self._run(plan, done, at)
            self.add_each([window[at]], 0)
            done = at + 1
        self._run(plan, done, len(window))

    def _run(self, plan: _Plan, first: int, stop: int) -> None:
        """The plain events first..stop-1 of the window as rows; flows counted."""
        if stop <= first:
            return
        flows = int(np.count_nonzero(plan.flows[first:stop]))
        if flows:
            self._skip("flow", flows)
        rows = plan.rows
        lo, hi = np.searchsorted(rows, (first, stop))
        taken = rows[lo:hi]
        if not len(taken):
            return
        chunk = self.current
        base = chunk.count
        depth = np.zeros(len(taken), np.int64)
        lo, hi = np.searchsorted(plan.laned, (first, stop))
        if hi > lo:
            lane = self._lane
            depth[np.searchsorted(taken, plan.laned[lo:hi])] = [
                lane(key, start, end)
                for key, start, end in zip(
                    plan.lane_keys[lo:hi], plan.lane_starts[lo:hi], plan.lane_ends[lo:hi], strict=True
                )
            ]
        lo, hi = np.searchsorted(plan.linked, (first, stop))
        if hi > lo:
            self._link(plan, lo, hi, base + np.searchsorted(taken, plan.linked[lo:hi]))
        for key, (at, values) in plan.extras.items():
            at_rows = np.asarray(at, np.intp)
            lo, hi = np.searchsorted(at_rows, (first, stop))
            if hi > lo:
                found = base + np.searchsorted(taken, at_rows[lo:hi])
                chunk.extras[key].update(zip(found.tolist(), values[lo:hi], strict=True))
        kinds, names = plan.kinds, plan.names
        listed = taken.tolist()
        columns = {
            "kind": [kinds[at] for at in listed],
            "name": [names[at] for at in listed],
            "depth": depth,
        }
        for column, values in plan.numbers.items():
            columns[column] = values[taken]
        chunk.extend(columns, len(taken))

    def _link(self, plan: _Plan, lo: int, hi: int, row_of: np.ndarray) -> None:
        """CUDA calls remembered, and GPU work linked to its call (or waiting for it), in file order."""
        calls, waiting, chunk = self._calls, self._waiting, self.current
        links = chunk.links
        for at, row in zip(plan.linked[lo:hi].tolist(), row_of.tolist(), strict=True):
            correlation = plan.correlations[at]
            if plan.codes[at] == _CUDA_API:
                self._call(correlation, plan.pids[at], plan.tids[at], plan.starts[at], plan.names[at])
            else:
                call = calls.get(correlation)
                if call is not None:
                    links[row] = call
                else:
                    waiting.setdefault(correlation, []).append((chunk, row))
                    chunk.waiting.append(correlation)


class _Plan:
    """What a window's events become, as far as that needs no state but caches: kinds, times, ids,
    names, args' values and extras per event; `uneven`: events left to the per-event code."""

    def __init__(self, rows: ColumnRows, window: list[Event], kinds: list[Any]) -> None:
        count = len(window)
        codes = np.fromiter(map(_CODES.__getitem__, kinds), np.int8, count)
        self.flows = codes == 1
        start, start_proved, _ = ns_column([e.ts for e in window])
        length, length_proved, no_length = ns_column([e.dur for e in window])
        start += rows.offset
        marks = codes == _MARK
        length[no_length | marks] = 0
        end = start + length
        good = (
            (codes >= _MARK)
            & start_proved
            & (marks | no_length | (length_proved & (length >= 0) & (length <= MAX_EVENT_NS)))
            & (start >= 0)
            & (end <= MAX_NS)
        )
        names = [e.name for e in window]
        if set(map(type, names)) != {str} or max(map(len, names)) * 4 > MAX_STRING:
            good &= np.array([type(name) is str and len(name) * 4 <= MAX_STRING for name in names], bool)
        host = good & (codes < _GPU)
        pid, pid_ok = id_column([e.pid for e in window], UINT32)
        tid, tid_ok = id_column([e.tid for e in window], 1 << 63)
        plain = host & pid_ok & tid_ok
        pid[~plain] = 0
        tid[~plain] = 0
        gpu = np.full(count, NO_GPU, np.int64)
        stream = np.full(count, NO_STREAM, np.int64)
        correlation = np.zeros(count, np.int64)
        size = np.zeros(count, np.int64)
        self.kinds = kinds
        self.names = names = list(names)
        self.extras: dict[str, tuple[list[int], list[str]]] = {}
        for at in np.flatnonzero(plain & (codes == _CUDA_API)).tolist():
            names[at] = rows._api_name(names[at])
            correlation[at] = _correlation(window[at].args)
            self._extra("api", at, "driver" if window[at].cat == "cuda_driver" else "runtime")
        for at in np.flatnonzero(plain & (codes == _NVTX)).tolist():
            if names[at].startswith(STEP_PREFIX):
                self._extra("step", at, names[at][len(STEP_PREFIX) :])
                kinds[at] = names[at] = "step"
            self._extra("style", at, "PushPop")
        for at in np.flatnonzero(good & (codes >= _GPU)).tolist():
            if self._gpu_work(rows, window[at], at, gpu, stream, correlation, size):
                plain[at] = True
        self.codes = codes.tolist()
        self.uneven = ~(plain | self.flows)
        self.rows = np.flatnonzero(plain)
        self.numbers = {
            "start": start, "end": end, "gpu": gpu, "stream": stream, "pid": pid, "tid": tid,
            "correlation_id": correlation, "bytes": size,
        }  # fmt: skip
        self.laned = np.flatnonzero(plain & (((codes >= 3) & (codes <= _NVTX)) | (codes == _GPU_ANNOTATION)))
        laned = self.laned.tolist()
        on_gpu = codes[self.laned] == _GPU_ANNOTATION
        self.lane_keys = list(
            zip(
                [_LANE_FAMILIES[kinds[at]] for at in laned],
                np.where(on_gpu, gpu[self.laned], pid[self.laned]).tolist(),
                np.where(on_gpu, stream[self.laned], tid[self.laned]).tolist(),
                strict=True,
            )
        )
        self.lane_starts = start[self.laned].tolist()
        self.lane_ends = end[self.laned].tolist()
        self.linked = np.flatnonzero(plain & (correlation != 0))
        self.correlations = correlation.tolist()
        self.pids, self.tids, self.starts = pid.tolist(), tid.tolist(), start.tolist()

    def _extra(self, key: str, at: int, value: str) -> None:
        found = self.extras.get(key)
        if found is None:
            found = self.extras[key] = ([], [])
        found[0].append(at)
        found[1].append(value)

    def _gpu_work(
        self,
        rows: ColumnRows,
        event: Event,
        at: int,
        gpu: np.ndarray,
        stream: np.ndarray,
        correlation: np.ndarray,
        size: np.ndarray,
    ) -> bool:
        """GPU work's values from its args, as the per-event code takes them; False where it is
        skipped (its device is out of range), which the per-event code counts in its place."""
        args = event.args
        if type(args) is not dict:
            args = _EMPTY
        if _out_of_range(args.get("device"), MAX_GPU + 1, NO_GPU):
            return False
        device = args.get("device", event.pid)
        if type(device) is int and 0 <= device <= MAX_GPU:
            gpu[at] = device
        lane = args.get("stream", event.tid)
        if type(lane) is int and 0 <= lane < (1 << 31):
            stream[at] = lane
        kind = self.kinds[at]
        if kind == "kernel":
            launch = rows._launch(args)
            if launch:
                self._extra("launch", at, launch)
            occupancy = args.get("est. achieved occupancy %")
            if type(occupancy) in (int, Decimal, float):
                self._extra("occupancy_pct", at, number_text(occupancy))
            if "In msg nelems" in args:
                size[at] = message_bytes(args)
        elif kind == "memcpy" or kind == "memset":
            self.names[at], memory = rows._memory(self.names[at])
            if memory:
                self._extra("memory", at, memory)
            size[at] = uint_below(args.get("bytes"), MAX_EVENT_BYTES + 1) or 0
        elif kind == "sync":
            self._extra("sync_type", at, fit_string(args.get("cuda_sync_kind") or self.names[at]))
        if kind in GPU_WORK:
            correlation[at] = _correlation(args)
        return True
