"""One Kineto event at a time into rows of Arrow chunks (agent/traces/kineto.py says what each event
becomes): the categories, the values of an event (times, ids, strings), and EventRows, which
turns events into rows of the chunk being built (agent/traces/kineto_chunk.py), links GPU work to
the CUDA call that launched it and gives each row its depth in its thread's lanes. The importer
maps most events a window at a time, column-wise (agent/traces/kineto_columns.py, the same rows):
EventRows.add_each is the reference it matches, and what it leaves to the per-event code."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pyarrow as pa

from agent.traces.kineto_blocks import Event
from agent.traces.kineto_chunk import Chunk
from agent.traces.kineto_scan import KinetoError
from agent.traces.nsys_sources import MEMCPY_KINDS, strip_api_version
from agent.traces.tracefile import MAX_EVENT_BYTES, MAX_EVENT_NS, MAX_TIME_NS
from tracehouse.model import DEFAULT_LIMITS, NO_GPU, NO_STREAM

CHUNK_ROWS = 65_536  # rows per batch; batch ids depend on it, so it is part of the format
LINK_WINDOW = 2 * CHUNK_ROWS  # CUDA calls remembered for GPU work that comes after them
MAX_LANES = 256  # per thread (or GPU stream) and family
MAX_THREADS = 262_144  # threads and GPU streams, per family, whose lanes are kept
MAX_NAMES = 100_000  # process names, thread names
MAX_REASONS = 32  # distinct reasons to skip; more go under "other"
MAX_STRING = DEFAULT_LIMITS.max_string_bytes
MAX_GPU = DEFAULT_LIMITS.max_gpu_index
MAX_NS = MAX_TIME_NS  # times of events: 1970..2200, as the server takes them
UINT32 = 1 << 32

# category -> kind; `user_annotation` named ProfilerStep#N becomes a step
CATEGORIES: Mapping[str, str] = {
    "kernel": "kernel",
    "Kernel": "kernel",  # the capitalized categories: older Kineto versions
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_sync": "sync",
    "cuda_runtime": "cuda_api",
    "Runtime": "cuda_api",
    "cuda_driver": "cuda_api",
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "python_function": "python",
    "user_annotation": "nvtx",
    "gpu_user_annotation": "gpu_annotation",
    "cpu_instant_event": "mark",
}
GPU_WORK = frozenset({"kernel", "memcpy", "memset", "sync"})  # linked to their CUDA call
ON_GPU = GPU_WORK | {"gpu_annotation"}  # pid is the device, tid the stream
FLOWS = frozenset({"s", "t", "f"})
INSTANTS = frozenset({"i", "I"})
TIMED = INSTANTS | {"X"}
STEP_PREFIX = "ProfilerStep#"

_MEMCPY = re.compile(r"Memcpy (\w+) \((.*) -> (.*)\)")
_MEMSET = re.compile(r"Memset \((.*)\)")
_KINETO_MEMCPY = {
    "HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8, "HtoH": 9, "PtoP": 10,
}  # fmt: skip
_EMPTY: dict[str, Any] = {}
_FLOAT_EXACT = float(1 << 52)


# -- values -----------------------------------------------------------------------------------


def to_ns(value: Any) -> int | None:
    """µs, as an int, a decimal or a float from the parser, to integer ns (nearest, half to even);
    None for anything that is not a finite number of a sane size. A float is taken as the decimal
    it prints as (kineto_blocks parses as floats only numbers that a float holds exactly)."""
    if type(value) is int:
        return value * 1000
    if type(value) is float:
        ns = value * 1000
        if -_FLOAT_EXACT < ns < _FLOAT_EXACT:
            nearest = round(ns)
            if abs(ns - nearest) + abs(ns) * 2**-50 < 0.5:  # not near a half, whatever the float's error
                return nearest
        value = Decimal(repr(value))
    if type(value) is Decimal:
        if not value.is_finite() or value.adjusted() > 18:
            return None
        return int((value * 1000).to_integral_value())
    return None


def _ns(value: Any) -> int | None:
    """to_ns, with the times most traces write (a float of a few decimals, an int) done here."""
    if type(value) is float:
        ns = value * 1000
        if -_FLOAT_EXACT < ns < _FLOAT_EXACT:
            nearest = round(ns)
            if abs(ns - nearest) + abs(ns) * 2**-50 < 0.5:
                return nearest
    elif type(value) is int:
        return value * 1000
    return to_ns(value)


def uint_below(value: Any, bound: int) -> int | None:
    return value if type(value) is int and 0 <= value < bound else None


INT32_LOW = -(1 << 31)  # Kineto writes ids past 2^31 as negative int32: kept, as `track`


def _out_of_range(value: Any, end: int, low: int = INT32_LOW) -> bool:
    """A number that is no id in [low, end): its event is skipped (counted), not filed under another id.
    What is not a number (a track's name, absent) is not an id at all: the event keeps it as `track`."""
    kind = type(value)
    return (kind is int or kind is float or kind is Decimal) and not (kind is int and low <= value < end)


def fit_string(value: Any, limit: int = MAX_STRING) -> str:
    """A string fit for the store: cut to `limit` bytes of UTF-8 on a character boundary."""
    if type(value) is not str:
        return number_text(value) if type(value) in (int, Decimal, float) else ""
    if len(value) * 4 <= limit:
        return value
    raw = value.encode("utf-8", "replace")
    return raw[:limit].decode("utf-8", "ignore") if len(raw) > limit else value


def number_text(value: int | Decimal | float) -> str:
    """A number as written (a float: as the decimal it prints as; kineto_blocks)."""
    return str(Decimal(repr(value))) if type(value) is float else str(value)


def _label(value: Any) -> str:
    """An untrusted category or phase as a short reason to skip."""
    if type(value) is str:
        return fit_string(value, 48)
    return "Decimal" if type(value) is float else type(value).__name__  # a float is a decimal written


# -- rows -------------------------------------------------------------------------------------


class EventRows:
    """Events turned into rows, one at a time: rows of the current chunk, or counted as skipped per
    reason; GPU work linked to its CUDA call (calls remembered for the last LINK_WINDOW, GPU work
    waiting for its call until its chunk is released), depths from the lanes of each thread, and
    the names of processes and threads."""

    def __init__(self, file: str) -> None:
        self._file = file  # the trace's file name, for messages
        self.offset = 0  # added to every time: the trace's time base, ns
        self.current = Chunk()
        self.skipped: dict[str, int] = {}
        self.deep_rows = 0
        self.process_names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self._lanes: dict[tuple[Any, ...], list[int]] = {}
        self._calls: OrderedDict[int, tuple[int, int, int, str]] = OrderedDict()
        self._waiting: dict[int, list[tuple[Chunk, int]]] = {}
        self._api_names: dict[str, str] = {}
        self._memory_names: dict[str, tuple[str, str]] = {}
        self._launches: dict[tuple[Any, ...], str] = {}

    def release(self, chunk: Chunk) -> pa.RecordBatch:
        """The chunk as a batch; its rows no longer wait for their call."""
        for correlation in chunk.waiting:
            rows = [entry for entry in self._waiting.get(correlation, ()) if entry[0] is not chunk]
            if rows:
                self._waiting[correlation] = rows
            else:
                self._waiting.pop(correlation, None)
        return chunk.batch()

    def _skip(self, reason: str, count: int = 1) -> None:
        if reason not in self.skipped and len(self.skipped) >= MAX_REASONS:
            reason = "other"
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def add(self, event: Any) -> None:
        """One event (an Event, or an item that is not an object), as a row of the current chunk
        (which is not full), or counted as skipped."""
        if not self.add_each([event], 0):
            raise ValueError("the current chunk is full")

    def add_all(self, events: list[Any], at: int) -> int:
        """Events from `at` on, until the current chunk is full; returns the index of the first
        event not taken (agent/traces/kineto_columns.py maps runs of them at once)."""
        return self.add_each(events, at)

    def add_each(self, events: list[Any], at: int) -> int:
        """add_all, one event at a time: one loop with its state in local names. Every event the
        column-wise mapping cannot prove plain comes here."""
        skipped, offset, chunk = self.skipped, self.offset, self.current
        extras, links = chunk.extras, chunk.links
        calls, lane_of = self._calls, self._lane
        count = len(events)
        while at < count and chunk.count < CHUNK_ROWS:
            event = events[at]
            at += 1
            if type(event) is not Event:
                self._skip("not an event")
                continue
            ph = event.ph
            if ph == "X":
                category = event.cat
                kind = CATEGORIES.get(category) if type(category) is str else None
                if kind is None:
                    self._skip(f"category {_label(category)}")
                    continue
            elif type(ph) is not str:
                self._skip(f"phase {_label(ph)}")
                continue
            elif ph in INSTANTS:
                kind = "mark"
            elif ph == "M":
                self._name(event)
                continue
            elif ph in FLOWS:
                if "flow" in skipped:
                    skipped["flow"] += 1
                else:
                    self._skip("flow")
                continue
            else:
                self._skip(f"phase {_label(ph)}")
                continue
            start = _ns(event.ts)
            if start is None:
                self._skip("no time")
                continue
            start += offset
            duration = event.dur if ph == "X" and kind != "mark" else None
            if duration is None:
                end = start
            else:
                length = _ns(duration)
                if length is None or length < 0 or length > MAX_EVENT_NS:
                    self._skip("bad duration")
                    continue
                end = start + length
            if start < 0 or end > MAX_NS:
                self._skip("time out of range")
                continue
            args = event.args
            if type(args) is not dict:
                args = _EMPTY
            name = event.name
            if type(name) is not str or len(name) * 4 > MAX_STRING:
                name = fit_string(name)
            row = chunk.count
            gpu, stream, pid, tid, correlation, size, depth = NO_GPU, NO_STREAM, 0, 0, 0, 0, 0
            if kind in ON_GPU:
                if _out_of_range(args.get("device"), MAX_GPU + 1, NO_GPU):
                    self._skip("device out of range")
                    continue
                device = args.get("device", event.pid)
                gpu = device if type(device) is int and 0 <= device <= MAX_GPU else NO_GPU
                lane = args.get("stream", event.tid)
                stream = lane if type(lane) is int and 0 <= lane < (1 << 31) else NO_STREAM
                if kind == "kernel":
                    launch = self._launch(args)
                    if launch:
                        extras["launch"][row] = launch
                    occupancy = args.get("est. achieved occupancy %")
                    if type(occupancy) in (int, Decimal, float):
                        extras["occupancy_pct"][row] = number_text(occupancy)
                    if "In msg nelems" in args:  # a collective's kernel (PyTorch 2.2 on): its message's bytes
                        size = message_bytes(args)
                elif kind == "memcpy" or kind == "memset":
                    name, memory = self._memory(name)
                    if memory:
                        extras["memory"][row] = memory
                    size = uint_below(args.get("bytes"), MAX_EVENT_BYTES + 1) or 0
                elif kind == "sync":
                    extras["sync_type"][row] = fit_string(args.get("cuda_sync_kind") or name)
                else:  # gpu_annotation
                    depth = lane_of(("gpu", gpu, stream), start, end)
                if kind != "gpu_annotation":
                    correlation = args.get("correlation")
                    if type(correlation) is not int or not 0 <= correlation < 1 << 63:
                        correlation = 0
            else:
                pid, tid = event.pid, event.tid
                if type(pid) is not int or not 0 <= pid < UINT32 or type(tid) is not int or not 0 <= tid < 1 << 63:
                    if _out_of_range(pid, UINT32) or _out_of_range(tid, 1 << 63):
                        self._skip(f"{'pid' if _out_of_range(pid, UINT32) else 'tid'} out of range")
                        continue
                    pid, tid = self._track(chunk, row, pid, tid)
                if kind == "cuda_api":
                    name = self._api_name(name)
                    extras["api"][row] = "driver" if event.cat == "cuda_driver" else "runtime"
                    correlation = args.get("correlation")
                    if type(correlation) is not int or not 0 <= correlation < 1 << 63:
                        correlation = 0
                elif kind == "nvtx":
                    if name.startswith(STEP_PREFIX):
                        kind, name = "step", "step"
                        extras["step"][row] = fit_string(event.name)[len(STEP_PREFIX) :]
                    extras["style"][row] = "PushPop"
                    depth = lane_of(("range", pid, tid), start, end)
                elif kind != "mark":
                    depth = lane_of((kind, pid, tid), start, end)
            chunk.append((kind, start, end, name, gpu, stream, pid, tid, correlation, size, depth))
            if correlation:
                if kind == "cuda_api":
                    self._call(correlation, pid, tid, start, name)
                elif kind in GPU_WORK:
                    call = calls.get(correlation)
                    if call is not None:
                        links[row] = call
                    else:
                        self._waiting.setdefault(correlation, []).append((chunk, row))
                        chunk.waiting.append(correlation)
        return at

    @staticmethod
    def _track(chunk: Chunk, row: int, raw_pid: Any, raw_tid: Any) -> tuple[int, int]:
        """A process and thread that are not ids: 0, with what was written as the extra `track`."""
        pid = raw_pid if type(raw_pid) is int and 0 <= raw_pid < UINT32 else 0
        tid = raw_tid if type(raw_tid) is int and 0 <= raw_tid < 1 << 63 else 0
        if (raw_pid is not None and pid != raw_pid) or (raw_tid is not None and tid != raw_tid):
            chunk.extras["track"][row] = fit_string(f"{_label(raw_pid)} / {_label(raw_tid)}", 256)
        return pid, tid

    def _call(self, correlation: int, pid: int, tid: int, start: int, name: str) -> None:
        call = (pid, tid, start, name)
        self._calls[correlation] = call
        if len(self._calls) > LINK_WINDOW:
            self._calls.popitem(last=False)
        for chunk, row in self._waiting.pop(correlation, ()):
            chunk.links[row] = call

    def _lane(self, key: tuple[Any, ...], start: int, end: int) -> int:
        """The first lane of `key` free at `start`; it is busy until `end` from now on."""
        lanes = self._lanes.get(key)
        if lanes is None:
            if len(self._lanes) >= MAX_THREADS:
                raise KinetoError(f"{self._file}: events on more than {MAX_THREADS} threads or GPU streams")
            lanes = self._lanes[key] = []
        for lane, busy_until in enumerate(lanes):
            if busy_until <= start:
                lanes[lane] = end
                return lane
        if len(lanes) < MAX_LANES:
            lanes.append(end)
            return len(lanes) - 1
        self.deep_rows += 1
        lanes[-1] = max(lanes[-1], end)
        return MAX_LANES - 1

    def _name(self, event: Event) -> None:
        """Metadata events: process and thread names."""
        what = event.name
        args = event.args
        label = args.get("name") if isinstance(args, dict) else None
        if type(label) is not str:
            return
        pid = uint_below(event.pid, UINT32)
        if pid is None:
            return
        if what == "process_name" and (pid in self.process_names or len(self.process_names) < MAX_NAMES):
            self.process_names[pid] = fit_string(label)
        elif what == "thread_name":
            tid = uint_below(event.tid, 1 << 63)
            if tid is not None and ((pid, tid) in self.thread_names or len(self.thread_names) < MAX_NAMES):
                self.thread_names[(pid, tid)] = fit_string(label)

    def _api_name(self, name: str) -> str:
        found = self._api_names.get(name)
        if found is None:
            if len(self._api_names) > MAX_NAMES:
                self._api_names.clear()
            found = self._api_names[name] = strip_api_version(name)
        return found

    def _memory(self, name: str) -> tuple[str, str]:
        """Kineto's `Memcpy HtoD (Pageable -> Device)` as nsys names it: `[CUDA memcpy
        Host-to-Device]`, memory `Pageable to Device`. Other names stay as they are."""
        found = self._memory_names.get(name)
        if found is None:
            if len(self._memory_names) > MAX_NAMES:
                self._memory_names.clear()
            found = (name, "")
            if (copy := _MEMCPY.fullmatch(name)) and copy.group(1) in _KINETO_MEMCPY:
                kind = MEMCPY_KINDS[_KINETO_MEMCPY[copy.group(1)]]
                found = (f"[CUDA memcpy {kind}]", f"{copy.group(2)} to {copy.group(3)}")
            elif memset := _MEMSET.fullmatch(name):
                found = ("[CUDA memset]", memset.group(1))
            self._memory_names[name] = found
        return found

    def _launch(self, args: dict[str, Any]) -> str:
        grid, block = _dims(args.get("grid")), _dims(args.get("block"))
        if grid is None or block is None:
            return ""
        registers, shared = args.get("registers per thread"), args.get("shared memory")
        key = (*grid, *block, registers if type(registers) is int else None, shared if type(shared) is int else None)
        found = self._launches.get(key)
        if found is None:
            if len(self._launches) > MAX_NAMES:
                self._launches.clear()
            text = f"grid {grid[0]}x{grid[1]}x{grid[2]}, block {block[0]}x{block[1]}x{block[2]}"
            if key[6] is not None:
                text += f", {registers} registers"
            if key[7] is not None:
                text += f", {shared} B shared"
            found = self._launches[key] = text
        return found


def _dims(value: Any) -> list[int] | None:
    """A launch dimension: three integers."""
    if (
        type(value) is list
        and len(value) == 3
        and type(value[0]) is int
        and type(value[1]) is int
        and type(value[2]) is int
    ):
        return value
    return None


# bytes per element of the dtypes PyTorch names in a collective's args
DTYPE_BYTES = {
    "Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Short": 2, "Byte": 1, "Char": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}  # fmt: skip


def message_bytes(args: dict[str, Any]) -> int:
    """A collective's size as nccl-tests counts it: the larger of its input and output messages
    (`In msg nelems`, `Out msg nelems`) times its dtype's bytes; 0 where either is not known."""
    dtype = args.get("dtype")
    width = DTYPE_BYTES.get(dtype) if type(dtype) is str else None
    counts = [uint_below(args.get(key), MAX_EVENT_BYTES + 1) for key in ("In msg nelems", "Out msg nelems")]
    known = [count for count in counts if count is not None]
    if width is None or not known or max(known) * width > MAX_EVENT_BYTES:
        return 0
    return max(known) * width
