"""What a window of Kineto events becomes as far as that needs no state (agent/traces/kineto_columns.py):
each member taken out of the events once, as a list, and checked and converted a column at a time
as the per-event code (agent/traces/kineto_events.py) takes it one event at a time. `uneven` marks
the events that a check does not prove plain: the per-event code maps those."""

from __future__ import annotations

import contextlib
import itertools
import math
from decimal import Decimal
from typing import Any

import numpy as np

from agent.traces.kineto_blocks import Event
from agent.traces.kineto_chunk import KIND_CODES
from agent.traces.kineto_events import (
    _EMPTY,
    _FLOAT_EXACT,
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
    to_ns,
)
from tracehouse.model import NO_GPU, NO_STREAM

FLOW = "(flow)"
# kind -> code (the chunk's, kineto_chunk.KINDS); 0: not proved plain, 1: a flow
CODES: dict[Any, int] = {None: 0, FLOW: 1, **KIND_CODES}
MARK, CPU_OP, NVTX, CUDA_API = (KIND_CODES[kind] for kind in ("mark", "cpu_op", "nvtx", "cuda_api"))
KERNEL, MEMCPY, MEMSET, SYNC = (KIND_CODES[kind] for kind in ("kernel", "memcpy", "memset", "sync"))
GPU, GPU_ANNOTATION = KERNEL, KIND_CODES["gpu_annotation"]  # codes from GPU on: work on the GPU
# by code: lanes are kept per family
LANE_FAMILIES = {CPU_OP: "cpu_op", KIND_CODES["python"]: "python", NVTX: "range", GPU_ANNOTATION: "gpu"}
NONE = type(None)
_FLOATS = frozenset({float, NONE})
_INTS = frozenset({int, NONE})
_INT_NS = (1 << 63) // 1000 - 1  # the largest int of µs whose ns are an int64
_ABSENT = object()
_NUMBER_TYPES = (int, Decimal, float)
Extras = dict[str, list[tuple[np.ndarray, list[str]]]]


def ns_column(values: list[Any], low: int, high: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """µs values to ns in [low, high], each as to_ns makes it: (ns, proved, absent); ns is 0 where
    not proved, absent says None. Floats and ints are converted in numpy where that is provably
    exact (a float's ns value not near a half; an int's in int64), any other value by to_ns."""
    types = set(map(type, values))
    absent = None
    if types <= _FLOATS:
        floats = np.array(values, np.float64)  # None is nan: a JSON number never is
        absent = np.isnan(floats)
        ns, proved = _float_ns(floats)
    elif types <= _INTS:
        with contextlib.suppress(OverflowError):  # an int beyond int64: to_ns takes it
            ints = np.array(values if NONE not in types else [0 if v is None else v for v in values], np.int64)
            absent = np.array([v is None for v in values], bool) if NONE in types else np.zeros(len(values), bool)
            proved = ~absent & (ints >= -_INT_NS) & (ints <= _INT_NS)
            ns = np.where(proved, ints, 0) * 1000
    if absent is None:
        ns, proved = _float_ns(np.array([v if type(v) is float else math.nan for v in values], np.float64))
        absent = np.array([v is None for v in values], bool)
    for at in np.flatnonzero(~(proved | absent)).tolist():  # Decimals, floats near a half, large ints
        exact = to_ns(values[at])
        if exact is not None and low <= exact <= high:
            ns[at], proved[at] = exact, True
    proved &= (ns >= low) & (ns <= high)
    ns[~proved] = 0
    return ns, proved, absent


def _float_ns(floats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """to_ns's float case: the nearest ns where the float is provably not near a half."""
    ns = floats * 1000.0
    nearest = np.rint(ns)
    size = np.abs(ns)
    proved = (size < _FLOAT_EXACT) & (np.abs(ns - nearest) + size * 2.0**-50 < 0.5)
    return np.where(proved, nearest, 0.0).astype(np.int64), proved


def id_column(values: list[Any], end: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids in [0, end) as int64 (0 elsewhere), and where they are."""
    if set(map(type, values)) == {int}:
        try:
            ids = np.array(values, np.int64)
        except OverflowError:
            pass
        else:
            inside = ids >= 0
            inside = inside & (ids < end) if end <= 1 << 62 else inside
            return np.where(inside, ids, 0), inside
    inside = np.array([type(v) is int and 0 <= v < end for v in values], bool)
    ids = np.zeros(len(values), np.int64)
    ids[inside] = [v for v, k in zip(values, inside.tolist(), strict=True) if k]
    return ids, inside


def _dicts(values: list[Any]) -> list[Any]:
    return values if set(map(type, values)) == {dict} else [v if type(v) is dict else _EMPTY for v in values]


class Plan:
    """A window's events as rows, but for lanes and links (which need state): kinds, names and
    the numeric columns per event, extras by event, the events that take a lane (`laned`, with
    their keys, starts and ends) and those with a correlation id (`linked`); `uneven`: events for
    the per-event code."""

    def __init__(self, rows: EventRows, window: list[Event], kinds: list[Any]) -> None:
        count = len(window)
        self.rows = rows
        self.window = window
        codes = np.fromiter(map(CODES.__getitem__, kinds), np.int8, count)
        self.flows = codes == 1
        offset = rows.offset  # 0..MAX_NS: a start in range is in int64, and so is its end
        start, start_proved, _ = ns_column([e.ts for e in window], -offset, MAX_NS - offset)
        length, length_proved, no_length = ns_column([e.dur for e in window], 0, MAX_EVENT_NS)
        start += offset
        marks = codes == MARK
        length[no_length | marks] = 0
        end = start + length
        good = (codes >= MARK) & start_proved & (marks | no_length | length_proved) & (end <= MAX_NS)
        names = [e.name for e in window]
        if set(map(type, names)) != {str} or max(map(len, names)) * 4 > MAX_STRING:
            good &= np.array([type(name) is str and len(name) * 4 <= MAX_STRING for name in names], bool)
        pid, pid_ok = id_column([e.pid for e in window], UINT32)
        tid, tid_ok = id_column([e.tid for e in window], 1 << 63)
        plain = good & (codes < GPU) & pid_ok & tid_ok
        pid[~plain] = 0
        tid[~plain] = 0
        self.gpu = np.full(count, NO_GPU, np.int64)
        self.stream = np.full(count, NO_STREAM, np.int64)
        self.correlation = np.zeros(count, np.int64)
        self.size = np.zeros(count, np.int64)
        self.kinds = kinds
        self.kind_codes = codes.copy()  # a step's is KIND_CODES["step"]
        self.names = list(names)
        self._extras: Extras = {}
        self._calls(np.flatnonzero(plain & (codes == CUDA_API)))
        self._ranges(np.flatnonzero(plain & (codes == NVTX)))
        plain |= self._gpu_work(good & (codes >= GPU), codes)
        self.uneven = ~(plain | self.flows)
        self.taken = np.flatnonzero(plain)
        self.numbers = {
            "start": start, "end": end, "gpu": self.gpu, "stream": self.stream, "pid": pid, "tid": tid,
            "correlation_id": self.correlation, "bytes": self.size,
        }  # fmt: skip
        self.laned = laned = np.flatnonzero(plain & np.isin(codes, list(LANE_FAMILIES)))
        self.lane_families = codes[laned]
        on_gpu = self.lane_families == GPU_ANNOTATION
        self.lane_ids = (
            np.where(on_gpu, self.gpu[laned], pid[laned]),
            np.where(on_gpu, self.stream[laned], tid[laned]),
        )
        self.lane_starts, self.lane_ends = start[laned], end[laned]
        self.linked = linked = np.flatnonzero(plain & (self.correlation != 0))
        self.link_correlations = self.correlation[linked].tolist()
        calling = linked[codes[linked] == CUDA_API]
        calls = zip(
            pid[calling].tolist(),
            tid[calling].tolist(),
            start[calling].tolist(),
            [self.names[at] for at in calling.tolist()],
            strict=True,
        )
        next_call = calls.__next__
        self.link_calls: list[tuple[int, int, int, str] | None] = [
            next_call() if is_call else None for is_call in (codes[linked] == CUDA_API).tolist()
        ]
        self.extras = {key: _sorted(pieces) for key, pieces in self._extras.items()}

    def _extra(self, key: str, at: Any, values: list[str]) -> None:
        if len(values):
            self._extras.setdefault(key, []).append((np.asarray(at, np.intp), values))

    def _calls(self, at: np.ndarray) -> None:
        """CUDA calls: names without their version, runtime or driver, correlation ids."""
        listed = at.tolist()
        window, names, cached, api_name = self.window, self.names, self.rows._api_names, self.rows._api_name
        for where in listed:
            name = names[where]
            names[where] = cached.get(name) or api_name(name)
        args = _dicts([window[where].args for where in listed])
        self.correlation[at] = id_column([a.get("correlation") for a in args], 1 << 63)[0]
        apis = ["driver" if window[where].cat == "cuda_driver" else "runtime" for where in listed]
        self._extra("api", at, apis)

    def _ranges(self, at: np.ndarray) -> None:
        """record_function ranges, ProfilerStep#N made a step."""
        names, kinds = self.names, self.kinds
        steps = [where for where in at.tolist() if names[where].startswith(STEP_PREFIX)]
        self._extra("step", steps, [names[where][len(STEP_PREFIX) :] for where in steps])
        for where in steps:
            kinds[where] = names[where] = "step"
        self.kind_codes[steps] = KIND_CODES["step"]
        self._extra("style", at, ["PushPop"] * len(at))

    def _gpu_work(self, good: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """GPU work's values from its args; returns where it is plain. Kernels, copies and ranges
        whose device and stream are written as ids are taken a column at a time, any other one at
        a time (_one_on_gpu)."""
        plain = np.zeros(len(good), bool)
        at = np.flatnonzero(good)
        if not len(at):
            return plain
        listed = at.tolist()
        window = self.window
        args = _dicts([window[where].args for where in listed])
        gpu, gpu_ok = id_column([a.get("device", _ABSENT) for a in args], MAX_GPU + 1)
        stream, stream_ok = id_column([a.get("stream", _ABSENT) for a in args], 1 << 31)
        columns = gpu_ok & stream_ok & (codes[at] != SYNC)
        for where, one in zip(at[~columns].tolist(), np.flatnonzero(~columns).tolist(), strict=True):
            plain[where] = self._one_on_gpu(window[where], where, args[one])
        if not columns.all():
            at, args = at[columns], [a for a, ok in zip(args, columns.tolist(), strict=True) if ok]
        plain[at] = True
        self.gpu[at], self.stream[at] = gpu[columns], stream[columns]
        kind = codes[at]
        work = kind != GPU_ANNOTATION
        self.correlation[at[work]] = id_column(
            [a.get("correlation") for a, w in zip(args, work.tolist(), strict=True) if w], 1 << 63
        )[0]
        kernels = kind == KERNEL
        self._kernels(at[kernels], [a for a, k in zip(args, kernels.tolist(), strict=True) if k])
        copies = (kind == MEMCPY) | (kind == MEMSET)
        self._copies(at[copies], [a for a, c in zip(args, copies.tolist(), strict=True) if c])
        return plain

    def _kernels(self, at: np.ndarray, args: list[dict[str, Any]]) -> None:
        launches = self._launches(args)
        known = [bool(text) for text in launches]
        self._extra("launch", at[known], [text for text in launches if text])
        occupancies = [a.get("est. achieved occupancy %") for a in args]
        known = [type(value) in _NUMBER_TYPES for value in occupancies]
        texts = [str(v) if type(v) is int else number_text(v) for v, k in zip(occupancies, known, strict=True) if k]  # type: ignore[arg-type]
        self._extra("occupancy_pct", at[known], texts)
        for where, a in zip(at.tolist(), args, strict=True):
            if "In msg nelems" in a:  # a collective's kernel (PyTorch 2.2 on): its message's bytes
                self.size[where] = message_bytes(a)

    def _launches(self, args: list[dict[str, Any]]) -> list[str]:
        """EventRows._launch of each, its cache looked up here where grid, block, registers and
        shared memory are what Kineto writes (three ints each, ints)."""
        grids: list[Any] = [a.get("grid") for a in args]
        blocks: list[Any] = [a.get("block") for a in args]
        registers = [a.get("registers per thread") for a in args]
        shared = [a.get("shared memory") for a in args]
        launch = self.rows._launch
        if not (
            _dims(grids) and _dims(blocks) and set(map(type, registers)) == {int} and set(map(type, shared)) == {int}
        ):
            return [launch(a) for a in args]
        cached = self.rows._launches
        keys = [
            (g[0], g[1], g[2], b[0], b[1], b[2], r, m)
            for g, b, r, m in zip(grids, blocks, registers, shared, strict=True)
        ]
        return [cached.get(key) or launch(a) for key, a in zip(keys, args, strict=True)]

    def _copies(self, at: np.ndarray, args: list[dict[str, Any]]) -> None:
        names, memory_of = self.names, self.rows._memory
        memories = []
        for where in at.tolist():
            names[where], memory = memory_of(names[where])
            memories.append(memory)
        known = [bool(memory) for memory in memories]
        self._extra("memory", at[known], [memory for memory in memories if memory])
        self.size[at] = id_column([a.get("bytes") for a in args], MAX_EVENT_BYTES + 1)[0]

    def _one_on_gpu(self, event: Event, at: int, args: dict[str, Any]) -> bool:
        """One event of GPU work as the per-event code takes it; False where it is skipped (its
        device is out of range), which the per-event code counts in its place."""
        if _out_of_range(args.get("device"), MAX_GPU + 1, NO_GPU):
            return False
        device = args.get("device", event.pid)
        if type(device) is int and 0 <= device <= MAX_GPU:
            self.gpu[at] = device
        lane = args.get("stream", event.tid)
        if type(lane) is int and 0 <= lane < (1 << 31):
            self.stream[at] = lane
        kind = self.kinds[at]
        if kind == "kernel":
            self._kernels(np.array([at]), [args])
        elif kind == "memcpy" or kind == "memset":
            self._copies(np.array([at]), [args])
        elif kind == "sync":
            self._extra("sync_type", [at], [fit_string(args.get("cuda_sync_kind") or self.names[at])])
        if kind != "gpu_annotation":
            correlation = args.get("correlation")
            self.correlation[at] = correlation if type(correlation) is int and 0 <= correlation < 1 << 63 else 0
        return True


def _dims(values: list[Any]) -> bool:
    """Every value a launch dimension: a list of three ints."""
    return (
        set(map(type, values)) == {list}
        and set(map(len, values)) == {3}
        and set(map(type, itertools.chain.from_iterable(values))) == {int}
    )


def _sorted(pieces: list[tuple[np.ndarray, list[str]]]) -> tuple[np.ndarray, list[str]]:
    """An extra's pieces as one, in the order of the events."""
    if len(pieces) == 1:
        return pieces[0]
    at = np.concatenate([piece[0] for piece in pieces])
    values = [value for piece in pieces for value in piece[1]]
    order = np.argsort(at, kind="stable")
    return at[order], [values[where] for where in order.tolist()]
