"""Read PyTorch-profiler (Kineto) traces: Chrome-trace JSON, plain or gzip, of any size.

A trace is read twice, both times as a stream. The first pass decompresses it (a truncated or
corrupt gzip file is refused here, before anything is sent), hashes it, checks that it is
UTF-8 and that its text starts and ends as complete JSON, and keeps its last MiB, from which
the top-level members written after the `traceEvents` array are read (Kineto writes
`baseTimeNanoseconds` there). The second pass reads the members before `traceEvents`
(`deviceProperties`, host names), then parses the events one at a time with ijson (yajl, in C)
and turns them into Arrow chunks of CHUNK_ROWS rows.

What an event becomes, by its category (`cat`) and phase (`ph`); the table is CATEGORIES:

- `kernel` -> kernel: gpu from `args.device`, stream, correlation id, and as extras the launch
  (`grid 864x1x1, block 256x1x1, 47 registers, 0 B shared`, as the nsys importer writes it)
  and the estimated occupancy.
- `gpu_memcpy`, `gpu_memset` -> memcpy, memset, named as nsys names them (`[CUDA memcpy
  Host-to-Device]`, `[CUDA memset]`; the memory kinds as the extra `memory`), with their bytes.
- `cuda_sync` -> sync, named by the CUDA call it belongs to once that is found (as nsys names
  them), Kineto's kind of sync as the extra `sync_type`.
- `cuda_runtime`, `cuda_driver` -> cuda_api (the `_vNNNN` suffix dropped as nsys stats does; the
  extra `api` says runtime or driver). Synchronizing calls stay cuda_api, as with nsys.
- `cpu_op` -> cpu_op, `python_function` -> python: depth is the nesting among the thread's ops
  (its Python functions).
- `user_annotation` (record_function ranges) -> nvtx with style PushPop, so that they take part
  in every analysis of NVTX ranges (PyTorch's own emit_nvtx makes the same ranges NVTX ranges
  under Nsight). `ProfilerStep#N` -> step named `step`, N as the extra `step`, as the training
  API names its steps (so that `--range step --instance K` and per-name analyses see every
  step). Steps and ranges nest together per thread: a step is at depth 0 and the ranges inside
  it below it, so that ranges of one thread, style and depth never overlap.
- `gpu_user_annotation` -> gpu_annotation on the GPU and stream it was projected on.
- phase `i`/`I` (instants, whatever their category) -> mark. Phase `M` names processes and
  threads (kinds process and thread, as for nsys). Flows (`s`, `t`, `f`: `ac2g`, `fwdbwd`) are
  not needed: `args.correlation` already links a call to its GPU work on both sides.
- A trace whose events up to the first one with a time include none with a phase (`ph`, a
  string) is not a Chrome trace (a JSON list of metrics, say) and is refused.
- Anything else (unknown categories, `Trace` spans, `cuda_profiler_range`, other phases, events
  without a time, with a negative duration or one over 366 days, a time outside 1970..2200,
  items that are not objects) is skipped and counted per reason (the result's `skipped`, the run's attrs). An `X`
  event without `dur` is an instant (end = start).

Depth is the first lane of the thread (or GPU stream) free at the event's start, kept per
family: for properly nested events in start order, as Kineto writes them, it is their nesting
depth; for any order, events of one lane never overlap. A thread has at most MAX_LANES lanes;
what does not fit shares the last (counted as `deep_rows` in the attrs).

GPU work (kernels, memcpy, memset, syncs) is linked to the CUDA call with the same correlation
id, as the nsys importer links it: its pid and tid become the launching thread's and
`launch_start` the call's start. Kineto writes a call and its GPU work a few events apart, in
either order; a chunk is held back until the next one is full, so a call up to CHUNK_ROWS rows
after its GPU work is still found, and calls are remembered for the last LINK_WINDOW calls. GPU
work whose call is not found in that window keeps pid 0 and no launch_start. The run is declared
(agent/importer.py) just before the first batch is sent, that is once two chunks are read: a
trace of fewer rows is read whole before anything is stored.

Time: `ts` and `dur` are µs, written with up to ns decimals; they are parsed as decimals, never
as binary floats, and rounded to the nearest ns (half to even). With `baseTimeNanoseconds`
(newer Kineto versions), ts counts from it; older traces write µs since the epoch (a base beside
a ts that is already past 2000 is not added again). If the first event's time, so made absolute,
is before 2000, the trace has relative time only and the run says so.

Bounded memory: two chunks, the link window, the lanes of each thread (a trace with events on
more than MAX_THREADS threads is refused), and the names of processes and threads (at most
MAX_NAMES of each); nothing grows with the number of events.
Strings are untrusted: invalid UTF-8 is replaced (U+FFFD; the attrs say so), names are cut to
the store's limit on a character boundary. A string may escape an unpaired UTF-16 surrogate,
which is not Unicode: yajl makes a lone high one `?` and cannot decode a lone low one; a trace
with one of those is refused.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import hashlib
import json
import os
import re
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import chain
from pathlib import Path
from typing import Any

import ijson
import pyarrow as pa

from agent.gpu import DeviceInfo
from agent.nsys import MEMCPY_KINDS, strip_api_version
from agent.tracefile import MAX_EVENT_BYTES, MAX_EVENT_NS, MAX_TIME_NS, JsonText, Part, TraceFileError, open_regular
from tracehouse.model import DEFAULT_LIMITS, NO_GPU, NO_STREAM

CHUNK_ROWS = 65_536  # rows per batch; batch ids depend on it, so it is part of the format
LINK_WINDOW = 2 * CHUNK_ROWS  # CUDA calls remembered for GPU work that comes after them
READ_BYTES = 1 << 20
TAIL_BYTES = 1 << 20  # the end of the text, where the members after traceEvents are
HEAD_TOKENS = 1_000_000  # a member before traceEvents larger than this is not kept
MAX_LANES = 256  # per thread (or GPU stream) and family
MAX_THREADS = 262_144  # threads and GPU streams, per family, whose lanes are kept
MAX_NAMES = 100_000  # process names, thread names
MAX_REASONS = 32  # distinct reasons to skip; more go under "other"
MAX_STRING = DEFAULT_LIMITS.max_string_bytes
MAX_NAME = DEFAULT_LIMITS.max_name_bytes
MAX_NS = MAX_TIME_NS  # times of events: 1970..2200, as the server takes them
YEAR_2000_NS = 946_684_800 * 10**9
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

# top-level members kept as run attrs: member -> attr
METADATA_ATTRS: Mapping[str, str] = {
    "schemaVersion": "kineto_schema_version",
    "traceName": "trace_name",
    "displayTimeUnit": "display_time_unit",
    "baseTimeNanoseconds": "base_time_ns",
    "trace_id": "trace_id",
    "cupti_version": "cupti_version",
    "cuda_runtime_version": "cuda_runtime_version",
    "cuda_driver_version": "cuda_driver_version",
    "pytorch_version": "pytorch_version",
    "record_shapes": "record_shapes",
    "profile_memory": "profile_memory",
    "with_stack": "with_stack",
    "with_flops": "with_flops",
}
DISTRIBUTED_ATTRS = ("rank", "world_size", "backend")
HOST_MEMBERS = ("hostname", "host_name", "hostName", "host")

_MEMCPY = re.compile(r"Memcpy (\w+) \((.*) -> (.*)\)")
_MEMSET = re.compile(r"Memset \((.*)\)")
_KINETO_MEMCPY = {
    "HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8, "HtoH": 9, "PtoP": 10,
}  # fmt: skip
_STRUCTURE = re.compile(rb'["\[\]{}]')
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')
_EMPTY: dict[str, Any] = {}


class KinetoError(TraceFileError):
    """The trace cannot be imported; the message is one line a person can act on."""


# -- values -----------------------------------------------------------------------------------


def to_ns(value: Any) -> int | None:
    """µs, as an int or a decimal from the parser, to integer ns (nearest, half to even); None
    for anything that is not a finite number of a sane size."""
    if type(value) is int:
        return value * 1000
    if type(value) is Decimal:
        if not value.is_finite() or value.adjusted() > 18:
            return None
        return int((value * 1000).to_integral_value())
    if type(value) is float:  # not from ijson; from callers that hand floats
        return round(value * 1000) if value == value and abs(value) < 1e19 else None
    return None


def _uint(value: Any, bound: int) -> int | None:
    return value if type(value) is int and 0 <= value < bound else None


def _text(value: Any, limit: int = MAX_STRING) -> str:
    """A string fit for the store: cut to `limit` bytes of UTF-8 on a character boundary."""
    if type(value) is not str:
        return str(value) if type(value) in (int, Decimal) else ""
    if len(value) * 4 <= limit:
        return value
    raw = value.encode("utf-8", "replace")
    return raw[:limit].decode("utf-8", "ignore") if len(raw) > limit else value


def _label(value: Any) -> str:
    """An untrusted category or phase as a short reason to skip."""
    return _text(value, 48) if type(value) is str else type(value).__name__


def _one_line(error: BaseException) -> str:
    message = error.args[0] if error.args else error
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    return str(message).strip().splitlines()[0][:200] if str(message).strip() else type(error).__name__


# -- the first pass ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scan:
    digest: str
    size: int
    mtime_ns: int
    gzip: bool
    text_bytes: int  # of JSON text, decompressed
    utf8: bool  # every byte is valid UTF-8
    layout: str  # "object" ({"traceEvents": [...], ...}) or "array" ([...])
    trailer: dict[str, Any]  # top-level members after traceEvents


def _scan(path: Path) -> _Scan:
    try:
        with open_regular(path) as raw:
            stat = os.fstat(raw.fileno())
            digest = hashlib.file_digest(raw, "sha256").hexdigest()
        decoder = codecs.getincrementaldecoder("utf-8")()
        utf8 = True
        first = b""
        tail = bytearray()
        text = JsonText(path, KinetoError)  # refuses hostile text (tracefile.JsonGuard) as it is read
        with contextlib.closing(text):
            while chunk := text.read(READ_BYTES):
                first = first or chunk.lstrip()[:1]
                if utf8:
                    try:
                        decoder.decode(chunk)
                    except UnicodeDecodeError:
                        utf8 = False
                tail += chunk
                if len(tail) > 2 * TAIL_BYTES:
                    del tail[:-TAIL_BYTES]
        total = text.consumed
        gzipped = text.gzip
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            utf8 = False
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise KinetoError(f"{path.name}: truncated or corrupt gzip file ({_one_line(error)})") from None
    except OSError as error:
        raise KinetoError(f"{path.name}: cannot read it ({error.strerror or _one_line(error)})") from None
    if not first:
        raise KinetoError(f"{path.name}: empty{' once decompressed' if gzipped else ''}; not a trace")
    if first not in (b"{", b"["):
        raise KinetoError(f"{path.name}: not JSON (a Chrome trace starts with {{ or [)")
    layout = "object" if first == b"{" else "array"
    closing = "}" if layout == "object" else "]"
    if bytes(tail.rstrip()[-1:]) != closing.encode():
        raise KinetoError(f"{path.name}: not JSON, or truncated (it does not end with the {closing} it opens with)")
    text_tail = bytes(tail[-TAIL_BYTES:])
    trailer = _trailer(text_tail, whole=total <= TAIL_BYTES) if layout == "object" else {}
    if not _unicode(trailer):  # json, unlike yajl, takes any escaped surrogate
        raise KinetoError(f"{path.name}: {_SURROGATE}")
    return _Scan(digest, stat.st_size, stat.st_mtime_ns, gzipped, total, utf8, layout, trailer)


def _escaped(text: bytes, position: int) -> bool:
    """Whether the quote at `position` is escaped: an odd number of backslashes before it."""
    before = position
    while before > 0 and text[before - 1] == 0x5C:
        before -= 1
    return (position - before) % 2 == 1


def _trailer(tail: bytes, whole: bool) -> dict[str, Any]:
    """The top-level members after the traceEvents array, read backwards from the end of the text.
    Outside strings, a quote ends a string when read backwards; inside, the first unescaped quote
    starts it. The array is the top-level one whose `[` follows the key "traceEvents" or, when the
    window starts inside a top-level array, that one (nothing else in a trace is that big)."""
    depth = 0
    inside = False
    closing = -1  # the `]` of the top-level array being read, if the one being read is an array
    for match in reversed(list(_STRUCTURE.finditer(tail))):
        position = match.start()
        char = tail[position]
        if inside:
            inside = not (char == 0x22 and not _escaped(tail, position))
        elif char == 0x22:
            inside = True
        elif char in b"]}":
            depth += 1
            if depth == 2:
                closing = position if char == 0x5D else -1
        else:
            depth -= 1
            if depth == 1 and closing >= 0:
                if char == 0x5B and _EVENTS_KEY.search(tail, max(0, position - 64), position):
                    return _members(tail[closing + 1 :])
                closing = -1
            if depth <= 0:
                return {}
    if not whole and depth >= 2 and closing >= 0:
        return _members(tail[closing + 1 :])
    return {}


def _unicode(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode()
    except UnicodeEncodeError:
        return False
    return True


def _members(text: bytes) -> dict[str, Any]:
    """`, "key": value, ... }` as a dict; {} when it is not that."""
    rest = text.strip()
    if not rest.startswith(b","):
        return {}
    try:
        members = json.loads(b"{" + rest[1:], parse_float=Decimal)
    except ValueError:
        return {}
    return members if isinstance(members, dict) else {}


# -- the second pass --------------------------------------------------------------------------


class _Text:
    """The trace's JSON text as ijson reads it: without a byte-order mark, checked by a JsonGuard
    (so the file is checked again if it changed since the first pass), invalid UTF-8 replaced when
    the first pass found some, and the bytes read so far counted."""

    def __init__(self, path: Path, scan: _Scan) -> None:
        self._raw = JsonText(path, KinetoError)  # the file may have changed since the first pass: checked again
        self._decoder = None if scan.utf8 else codecs.getincrementaldecoder("utf-8")("replace")
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        while True:
            data = self._raw.read(size)
            self.consumed += len(data)
            if self._decoder is None:
                return data
            text = self._decoder.decode(data, final=not data)
            if text or not data:
                return text.encode()

    def close(self) -> None:
        self._raw.close()


def _value(events: Iterator[tuple[str, str, Any]], first: tuple[str, str, Any]) -> Any:
    """The value starting with `first`, built from parse events; None if it is too large."""
    _, event, value = first
    if event not in ("start_map", "start_array"):
        return value
    builder = ijson.common.ObjectBuilder()
    builder.event(event, value)
    depth = 1
    tokens = 0
    for _, event, value in events:
        depth += event in ("start_map", "start_array")
        depth -= event in ("end_map", "end_array")
        tokens += 1
        if tokens <= HEAD_TOKENS:
            builder.event(event, value)
        if depth == 0:
            break
    return builder.value if tokens <= HEAD_TOKENS else None


def _head(text: _Text, name: str) -> dict[str, Any]:
    """The top-level members before traceEvents; the stream is left at the array's first item."""
    events = ijson.parse(text)
    _, event, _ = next(events)
    if event != "start_map":
        return {}  # an array: the events themselves
    head: dict[str, Any] = {}
    for prefix, event, value in events:
        if prefix == "" and event == "map_key":
            if value == "traceEvents":
                _, opened, _ = next(events)
                if opened != "start_array":
                    raise KinetoError(f"{name}: not a Chrome trace (its traceEvents is not a list)")
                return head
            head[value] = _value(events, next(events))
        elif prefix == "" and event == "end_map":
            break
    raise KinetoError(f"{name}: JSON, but not a Chrome trace (it has no traceEvents)")


@dataclass
class _Chunk:
    kind: list[str] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    gpu: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    pid: list[int] = field(default_factory=list)
    tid: list[int] = field(default_factory=list)
    correlation_id: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    launch_start: list[int] = field(default_factory=list)
    extras: defaultdict[str, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))
    waiting: list[int] = field(default_factory=list)  # correlation ids of its rows awaiting their call

    def batch(self) -> pa.RecordBatch:
        rows = len(self.start)
        columns: dict[str, pa.Array] = {
            "kind": pa.array(self.kind, pa.string()),
            "start": pa.array(self.start, pa.int64()),
            "end": pa.array(self.end, pa.int64()),
            "name": pa.array(self.name, pa.string()),
        }
        for column in ("gpu", "stream", "pid", "tid", "correlation_id", "bytes", "depth", "launch_start"):
            columns[column] = pa.array(getattr(self, column), pa.int64())
        for key, values in sorted(self.extras.items()):
            texts = [""] * rows
            for row, value in values.items():
                texts[row] = value
            columns[f"x:{key}"] = pa.array(texts, pa.string())
        return pa.RecordBatch.from_pydict(columns)


class KinetoTrace:
    """An open, checked Kineto trace (see the module's docstring). A context manager."""

    source = "kineto"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._scan = _scan(path)
        self.digest = self._scan.digest
        self._text = _Text(path, self._scan)
        self._skipped: dict[str, int] = {}
        self._deep_rows = 0
        self._process_names: dict[int, str] = {}
        self._thread_names: dict[tuple[int, int], str] = {}
        self._lanes: dict[tuple[Any, ...], list[int]] = {}
        self._calls: OrderedDict[int, tuple[int, int, int, str]] = OrderedDict()
        self._waiting: dict[int, list[tuple[_Chunk, int]]] = {}
        self._read = 0
        self._api_names: dict[str, str] = {}
        self._memory_names: dict[str, tuple[str, str]] = {}
        self._launches: dict[tuple[Any, ...], str] = {}
        self._current = _Chunk()
        self._offset = 0
        try:
            self.metadata = self._metadata_members()
            self.host = self._host()
            self._events = ijson.items(self._text, "traceEvents.item" if self._scan.layout == "object" else "item")
            self._primed = self._prime()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> KinetoTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        text = getattr(self, "_text", None)
        if text is not None:
            with contextlib.suppress(Exception):
                text.close()

    # -- what the importer asks ---------------------------------------------------------------

    def default_name(self) -> str:
        name = self.path.name
        for suffix in (".gz", ".json"):
            name = name.removesuffix(suffix)
        return name or self.path.name

    def attrs(self) -> dict[str, str]:
        attrs = {
            "file": self.path.name,
            "file_bytes": str(self._scan.size),
            "sha256": self.digest,
            "format": "kineto chrome trace" + (" (gzip)" if self._scan.gzip else ""),
            "json_bytes": str(self._scan.text_bytes),
            "gpus": str(len(self.devices())),
        }
        for member, attr in METADATA_ATTRS.items():
            value = self.metadata.get(member)
            if type(value) in (str, int, Decimal, bool):
                attrs[attr] = _text(str(value), 4096)
        distributed = self.metadata.get("distributedInfo")
        if isinstance(distributed, dict):
            for key in DISTRIBUTED_ATTRS:
                if type(distributed.get(key)) in (str, int):
                    attrs[f"distributed_{key}"] = _text(str(distributed[key]), 4096)
        if self.relative_time:
            attrs["time"] = "relative to an unknown origin (no baseTimeNanoseconds; ts is not time since the epoch)"
        if not self._scan.utf8:
            attrs["utf8"] = "invalid UTF-8 replaced with U+FFFD"
        if self._deep_rows:
            attrs["deep_rows"] = f"{self._deep_rows} rows nested beyond {MAX_LANES} lanes share the last"
        return attrs

    def parts(self) -> Iterator[Part]:
        yield Part("events", self._chunks(), self._estimate)

    def sample_chunks(self) -> Iterator[pa.RecordBatch]:
        return iter(())

    def devices(self) -> list[DeviceInfo]:
        """GPUs from deviceProperties (all the host's, as Kineto lists them)."""
        found = []
        properties = self.metadata.get("deviceProperties")
        driver = self.metadata.get("cuda_driver_version")
        for device in properties if isinstance(properties, list) else []:
            if not isinstance(device, dict) or _uint(device.get("id"), DEFAULT_LIMITS.max_gpu_index + 1) is None:
                continue
            major, minor = device.get("computeMajor"), device.get("computeMinor")
            found.append(
                DeviceInfo(
                    index=device["id"],
                    uuid="",
                    pci_bus_id="",
                    name=_text(device.get("name"), MAX_NAME),
                    memory_total=_uint(device.get("totalGlobalMem"), 1 << 63) or 0,
                    sm_count=_uint(device.get("numSms"), UINT32) or 0,
                    driver=str(driver) if type(driver) is int else "",
                    attrs={"compute_capability": f"{major}.{minor}"}
                    if type(major) is int and type(minor) is int
                    else {},
                )
            )
        return found[: DEFAULT_LIMITS.max_devices_per_batch]

    def process_names(self, pids: set[int]) -> dict[int, str]:
        return {pid: name for pid, name in self._process_names.items() if pid in pids}

    def thread_names(self, threads: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
        return {thread: name for thread, name in self._thread_names.items() if thread in threads}

    def skipped(self) -> dict[str, int]:
        return dict(sorted(self._skipped.items()))

    def check_unchanged(self) -> None:
        now = self.path.stat()
        if (now.st_size, now.st_mtime_ns) != (self._scan.size, self._scan.mtime_ns):
            raise KinetoError(f"{self.path.name}: the file changed while it was read; is it still being written?")

    # -- opening ------------------------------------------------------------------------------

    def _metadata_members(self) -> dict[str, Any]:
        text = _Text(self.path, self._scan)
        try:
            head = _head(text, self.path.name) if self._scan.layout == "object" else {}
        except ijson.JSONError as error:
            raise KinetoError(f"{self.path.name}: not valid JSON ({_one_line(error)})") from None
        except UnicodeDecodeError:
            raise KinetoError(f"{self.path.name}: {_SURROGATE}") from None
        finally:
            text.close()
        return {**head, **self._scan.trailer}

    def _host(self) -> str:
        for member in HOST_MEMBERS:
            value = self.metadata.get(member)
            if type(value) is str and value.strip():
                return _text(value.strip(), MAX_NAME)
        return ""

    def _prime(self) -> list[Any]:
        """Read up to the first event with a time: it decides the time base and the run's first
        start, and is kept to be imported first. The events before it need no time base (names,
        flows, events without a time): they are taken in as they are read."""
        base = self.metadata.get("baseTimeNanoseconds")
        base = base if type(base) is int and 0 <= base <= MAX_NS else 0
        primed: list[Any] = []
        first: int | None = None
        phased = False  # an event with a phase was read
        with self._reading():
            for event in self._events:
                if not self._read and not isinstance(event, dict):
                    raise KinetoError(f"{self.path.name}: JSON, but not a Chrome trace (its events are not objects)")
                if isinstance(event, dict) and type(event.get("ph")) is str:
                    phased = True
                    if event["ph"] in TIMED:
                        first = to_ns(event.get("ts"))
                        if first is not None:
                            primed.append(event)
                            break
                self._read += 1
                self._add(event)
        if self._read and not phased:
            raise KinetoError(f"{self.path.name}: JSON, but not a Chrome trace (none of its objects has a phase, ph)")
        if first is not None and base and first >= YEAR_2000_NS:
            base = 0  # ts is already time since the epoch
        self._offset = base
        self.relative_time = first is None or first + base < YEAR_2000_NS
        self.start_ns = min(max(0, first + base), MAX_NS) if first is not None else 0
        return primed

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        try:
            yield
        except ijson.JSONError as error:
            where = f"after {self._read} events"
            raise KinetoError(f"{self.path.name}: not valid JSON {where} ({_one_line(error)})") from None
        except UnicodeDecodeError:
            raise KinetoError(f"{self.path.name}: {_SURROGATE}") from None
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as error:
            raise KinetoError(f"{self.path.name}: cannot read it ({_one_line(error)})") from None

    def _estimate(self, done: int) -> int:
        return max(done, done * self._scan.text_bytes // max(1, self._text.consumed))

    # -- events -------------------------------------------------------------------------------

    def _chunks(self) -> Iterator[pa.RecordBatch]:
        """Chunks of CHUNK_ROWS rows. A full chunk is held until the next one is full: GPU work
        in it can still be linked to a call read later."""
        held: _Chunk | None = None
        starts: list[int] = []
        with self._reading():
            for event in chain(self._primed, self._events):
                self._read += 1
                self._add(event)
                if len(self._current.start) >= CHUNK_ROWS:
                    if held is not None:
                        starts.append(min(held.start))
                        yield self._release(held)
                    held, self._current = self._current, _Chunk()
        for chunk in (held, self._current):
            if chunk is not None and chunk.start:
                starts.append(min(chunk.start))
                yield self._release(chunk)
        if starts:
            self.start_ns = min(starts)

    def _release(self, chunk: _Chunk) -> pa.RecordBatch:
        for correlation in chunk.waiting:
            rows = [entry for entry in self._waiting.get(correlation, ()) if entry[0] is not chunk]
            if rows:
                self._waiting[correlation] = rows
            else:
                self._waiting.pop(correlation, None)
        return chunk.batch()

    def _skip(self, reason: str) -> None:
        if reason not in self._skipped and len(self._skipped) >= MAX_REASONS:
            reason = "other"
        self._skipped[reason] = self._skipped.get(reason, 0) + 1

    def _add(self, event: Any) -> None:
        """One event, as a row of the current chunk, or counted as skipped."""
        if not isinstance(event, dict):
            self._skip("not an event")
            return
        ph = event.get("ph")
        if type(ph) is not str:
            self._skip(f"phase {_label(ph)}")
            return
        if ph == "X":
            category = event.get("cat")
            kind = CATEGORIES.get(category) if type(category) is str else None
            if kind is None:
                self._skip(f"category {_label(category)}")
                return
        elif ph in INSTANTS:
            kind = "mark"
        elif ph == "M":
            self._name(event)
            return
        elif ph in FLOWS:
            self._skip("flow")
            return
        else:
            self._skip(f"phase {_label(ph)}")
            return
        start = to_ns(event.get("ts"))
        if start is None:
            self._skip("no time")
            return
        start += self._offset
        duration = event.get("dur") if ph == "X" and kind != "mark" else None
        if duration is None:
            end = start
        else:
            length = to_ns(duration)
            if length is None or length < 0 or length > MAX_EVENT_NS:
                self._skip("bad duration")
                return
            end = start + length
        if start < 0 or end > MAX_NS:
            self._skip("time out of range")
            return
        args = event.get("args")
        if not isinstance(args, dict):
            args = _EMPTY
        name = _text(event.get("name"))
        chunk = self._current
        row = len(chunk.start)
        extras = chunk.extras
        gpu, stream, pid, tid, correlation, size, depth = NO_GPU, NO_STREAM, 0, 0, 0, 0, 0
        if kind in ON_GPU:
            device = args.get("device", event.get("pid"))
            gpu = device if type(device) is int and 0 <= device <= DEFAULT_LIMITS.max_gpu_index else NO_GPU
            lane = args.get("stream", event.get("tid"))
            stream = lane if type(lane) is int and 0 <= lane < (1 << 31) else NO_STREAM
            if kind == "kernel":
                launch = self._launch(args)
                if launch:
                    extras["launch"][row] = launch
                occupancy = args.get("est. achieved occupancy %")
                if type(occupancy) in (int, Decimal):
                    extras["occupancy_pct"][row] = str(occupancy)
            elif kind in ("memcpy", "memset"):
                name, memory = self._memory(name)
                if memory:
                    extras["memory"][row] = memory
                size = _uint(args.get("bytes"), MAX_EVENT_BYTES + 1) or 0
            elif kind == "sync":
                extras["sync_type"][row] = _text(args.get("cuda_sync_kind") or name)
            else:  # gpu_annotation
                depth = self._lane(("gpu", gpu, stream), start, end)
            if kind != "gpu_annotation":
                correlation = _uint(args.get("correlation"), 1 << 63) or 0
        else:
            raw_pid, raw_tid = event.get("pid"), event.get("tid")
            pid = raw_pid if type(raw_pid) is int and 0 <= raw_pid < UINT32 else 0
            tid = raw_tid if type(raw_tid) is int and 0 <= raw_tid < 1 << 63 else 0
            if (raw_pid is not None and pid != raw_pid) or (raw_tid is not None and tid != raw_tid):
                extras["track"][row] = _text(f"{_label(raw_pid)} / {_label(raw_tid)}", 256)
            if kind == "cuda_api":
                name = self._api_name(name)
                extras["api"][row] = "driver" if event.get("cat") == "cuda_driver" else "runtime"
                correlation = _uint(args.get("correlation"), 1 << 63) or 0
            elif kind == "nvtx":
                if name.startswith(STEP_PREFIX):
                    kind, name = "step", "step"
                    extras["step"][row] = _text(event.get("name"))[len(STEP_PREFIX) :]
                extras["style"][row] = "PushPop"
                depth = self._lane(("range", pid, tid), start, end)
            elif kind != "mark":
                depth = self._lane((kind, pid, tid), start, end)
        chunk.kind.append(kind)
        chunk.start.append(start)
        chunk.end.append(end)
        chunk.name.append(name)
        chunk.gpu.append(gpu)
        chunk.stream.append(stream)
        chunk.pid.append(pid)
        chunk.tid.append(tid)
        chunk.correlation_id.append(correlation)
        chunk.bytes.append(size)
        chunk.depth.append(depth)
        chunk.launch_start.append(-1)
        if correlation:
            if kind == "cuda_api":
                self._call(correlation, pid, tid, start, name)
            elif kind in GPU_WORK:
                call = self._calls.get(correlation)
                if call is not None:
                    _link(chunk, row, call)
                else:
                    self._waiting.setdefault(correlation, []).append((chunk, row))
                    chunk.waiting.append(correlation)

    def _call(self, correlation: int, pid: int, tid: int, start: int, name: str) -> None:
        call = (pid, tid, start, name)
        self._calls[correlation] = call
        if len(self._calls) > LINK_WINDOW:
            self._calls.popitem(last=False)
        for chunk, row in self._waiting.pop(correlation, ()):
            _link(chunk, row, call)

    def _lane(self, key: tuple[Any, ...], start: int, end: int) -> int:
        """The first lane of `key` free at `start`; it is busy until `end` from now on."""
        lanes = self._lanes.get(key)
        if lanes is None:
            if len(self._lanes) >= MAX_THREADS:
                raise KinetoError(f"{self.path.name}: events on more than {MAX_THREADS} threads or GPU streams")
            lanes = self._lanes[key] = []
        for lane, busy_until in enumerate(lanes):
            if busy_until <= start:
                lanes[lane] = end
                return lane
        if len(lanes) < MAX_LANES:
            lanes.append(end)
            return len(lanes) - 1
        self._deep_rows += 1
        lanes[-1] = max(lanes[-1], end)
        return MAX_LANES - 1

    def _name(self, event: dict[str, Any]) -> None:
        """Metadata events: process and thread names."""
        what = event.get("name")
        args = event.get("args")
        label = args.get("name") if isinstance(args, dict) else None
        if type(label) is not str:
            return
        pid = _uint(event.get("pid"), UINT32)
        if pid is None:
            return
        if what == "process_name" and (pid in self._process_names or len(self._process_names) < MAX_NAMES):
            self._process_names[pid] = _text(label)
        elif what == "thread_name":
            tid = _uint(event.get("tid"), 1 << 63)
            if tid is not None and ((pid, tid) in self._thread_names or len(self._thread_names) < MAX_NAMES):
                self._thread_names[(pid, tid)] = _text(label)

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


_SURROGATE = "a string escapes an unpaired UTF-16 surrogate (\\ud800..\\udfff); not valid Unicode"


def _dims(value: Any) -> list[int] | None:
    """A launch dimension: three integers."""
    if type(value) is list and len(value) == 3 and all(type(v) is int for v in value):
        return value
    return None


def _link(chunk: _Chunk, row: int, call: tuple[int, int, int, str]) -> None:
    """GPU work at `row` was launched by `call`: the launching thread, the call's start, and a
    sync is named by its call, as nsys names it."""
    pid, tid, start, name = call
    chunk.pid[row] = pid
    chunk.tid[row] = tid
    chunk.launch_start[row] = start
    if chunk.kind[row] == "sync":
        chunk.name[row] = name
