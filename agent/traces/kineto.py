"""Read PyTorch-profiler (Kineto) traces: Chrome-trace JSON, plain or gzip, of any size.

A trace is read twice, both times as a stream. The first pass decompresses it (a truncated or
corrupt gzip file is refused here, before anything is sent), hashes it, checks that it is
UTF-8 and that its text starts and ends as complete JSON, and keeps its last MiB, from which
the top-level members written after the `traceEvents` array are read (Kineto writes
`baseTimeNanoseconds` there). No parser reads the first pass's text but for those members,
which are guarded on their own. The second pass reads the members before `traceEvents`
(`deviceProperties`, host names) with ijson, then the events, guarded (tracefile.JsonGuard),
a block of whole events at a time with msgspec (agent/traces/kineto_blocks.py), and turns them
into Arrow chunks of CHUNK_ROWS rows, column-wise where it can prove an event plain and one event
at a time where not (agent/traces/kineto_columns.py). What the guard refuses in the second pass (nesting, a
number or a string too long) is refused mid-import for a large file: the run says why and
stays out of every answer (agent/traces/importer.py). All of it runs in the importer's thread, one
step after the other: as threads of their own (the text, the parse and mapping, the sending), the
steps took turns holding the GIL and spent a fifth more CPU, and more time, than in one.

What an event becomes, by its category (`cat`) and phase (`ph`); the table is CATEGORIES
(agent/traces/kineto_events.py, which turns events into rows):

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
  without a time, with a negative duration or one over 366 days, a time outside 1970..2200, a
  number for a pid, tid or `args.device` that is no id (1e30, 2^64, a GPU past 4095), items that
  are not objects) is skipped and counted per reason (the result's `skipped`, the run's attrs). An `X`
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
(agent/traces/importer.py) just before the first batch is sent, that is once two chunks are read: a
trace of fewer rows is read whole before anything is stored.

Time: `ts` and `dur` are µs, written with up to ns decimals; they are read exactly as the
decimals written (as binary floats only where a float holds the decimal exactly:
agent/traces/kineto_blocks.py), and rounded to the nearest ns (half to even). With `baseTimeNanoseconds`
(newer Kineto versions), ts counts from it; older traces write µs since the epoch (a base beside
a ts that is already past 2000 is not added again). If the first event's time, so made absolute,
is before 2000, the trace has relative time only and the run says so.

Bounded memory: two chunks, a few blocks of events (about 1 MiB of text each), the link window,
the lanes of each thread (a trace with events on more than MAX_THREADS threads is refused), and
the names of processes and threads (at most MAX_NAMES of each); nothing grows with the number of
events.
Strings are untrusted: invalid UTF-8 is replaced (U+FFFD; the attrs say so), names are cut to
the store's limit on a character boundary. A string may escape an unpaired UTF-16 surrogate,
which is not Unicode: a trace with one among its events is refused (before the events, yajl
makes a lone high one `?`).
"""

from __future__ import annotations

import contextlib
import gzip
import zlib
from collections.abc import Iterator, Mapping
from decimal import Decimal
from itertools import chain
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agent.telemetry.gpu import DeviceInfo
from agent.traces.kineto_blocks import Event, EventBlocks
from agent.traces.kineto_chunk import Chunk
from agent.traces.kineto_columns import ColumnRows
from agent.traces.kineto_events import (
    CHUNK_ROWS,
    MAX_LANES,
    MAX_NS,
    TIMED,
    UINT32,
    fit_string,
    to_ns,
    uint_below,
)
from agent.traces.kineto_scan import KinetoError, TraceText, first_pass, head_members, one_line
from agent.traces.tracefile import Part
from tracehouse.model import DEFAULT_LIMITS

MAX_NAME = DEFAULT_LIMITS.max_name_bytes
YEAR_2000_NS = 946_684_800 * 10**9

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


class KinetoTrace:
    """An open, checked Kineto trace (see the module's docstring). A context manager."""

    source = "kineto"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._scan = first_pass(path)
        self.digest = self._scan.digest
        self._text = TraceText(path, self._scan, marking=True)
        self._rows = ColumnRows(path.name)  # what the events become
        self._read = 0
        try:
            self.metadata = self._metadata_members()
            self.host = self._host()
            self._blocks = EventBlocks(self._text, path.name, self._lists_before, self._scan.layout)
            self._events = iter(self._blocks)
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
                attrs[attr] = fit_string(str(value), 4096)
        distributed = self.metadata.get("distributedInfo")
        if isinstance(distributed, dict):
            for key in DISTRIBUTED_ATTRS:
                if type(distributed.get(key)) in (str, int):
                    attrs[f"distributed_{key}"] = fit_string(str(distributed[key]), 4096)
        if self.relative_time:
            attrs["time"] = "relative to an unknown origin (no baseTimeNanoseconds; ts is not time since the epoch)"
        if not self._scan.utf8:
            attrs["utf8"] = "invalid UTF-8 replaced with U+FFFD"
        if self._rows.deep_rows:
            attrs["deep_rows"] = f"{self._rows.deep_rows} rows nested beyond {MAX_LANES} lanes share the last"
        return attrs

    def parts(self) -> Iterator[Part]:
        yield Part("events", self._chunks(), self._estimate, read_ahead=False)

    def sample_chunks(self) -> Iterator[pa.RecordBatch]:
        return iter(())

    def devices(self) -> list[DeviceInfo]:
        """GPUs from deviceProperties (all the host's, as Kineto lists them)."""
        found = []
        properties = self.metadata.get("deviceProperties")
        driver = self.metadata.get("cuda_driver_version")
        for device in properties if isinstance(properties, list) else []:
            if not isinstance(device, dict) or uint_below(device.get("id"), DEFAULT_LIMITS.max_gpu_index + 1) is None:
                continue
            major, minor = device.get("computeMajor"), device.get("computeMinor")
            found.append(
                DeviceInfo(
                    index=device["id"],
                    uuid="",
                    pci_bus_id="",
                    name=fit_string(device.get("name"), MAX_NAME),
                    memory_total=uint_below(device.get("totalGlobalMem"), 1 << 63) or 0,
                    sm_count=uint_below(device.get("numSms"), UINT32) or 0,
                    driver=str(driver) if type(driver) is int else "",
                    attrs={"compute_capability": f"{major}.{minor}"}
                    if type(major) is int and type(minor) is int
                    else {},
                )
            )
        return found[: DEFAULT_LIMITS.max_devices_per_batch]

    def process_names(self, pids: set[int]) -> dict[int, str]:
        return {pid: name for pid, name in self._rows.process_names.items() if pid in pids}

    def thread_names(self, threads: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
        return {thread: name for thread, name in self._rows.thread_names.items() if thread in threads}

    def skipped(self) -> dict[str, int]:
        return dict(sorted(self._rows.skipped.items()))

    def check_unchanged(self) -> None:
        now = self.path.stat()
        if (now.st_size, now.st_mtime_ns) != (self._scan.size, self._scan.mtime_ns):
            raise KinetoError(f"{self.path.name}: the file changed while it was read; is it still being written?")

    # -- opening ------------------------------------------------------------------------------

    def _metadata_members(self) -> dict[str, Any]:
        head, self._lists_before = head_members(self.path, self._scan)
        return {**head, **self._scan.trailer}

    def _host(self) -> str:
        for member in HOST_MEMBERS:
            value = self.metadata.get(member)
            if type(value) is str and value.strip():
                return fit_string(value.strip(), MAX_NAME)
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
            for block in self._events:
                for at, event in enumerate(block):
                    if not self._read and type(event) is not Event:
                        raise KinetoError(
                            f"{self.path.name}: JSON, but not a Chrome trace (its events are not objects)"
                        )
                    if type(event) is Event and type(event.ph) is str:
                        phased = True
                        if event.ph in TIMED:
                            first = to_ns(event.ts)
                            if first is not None:
                                primed = block[at:]
                                break
                    self._read += 1
                    self._rows.add(event)
                if primed:
                    break
        if self._read and not phased:
            raise KinetoError(f"{self.path.name}: JSON, but not a Chrome trace (none of its objects has a phase, ph)")
        if first is not None and base and first >= YEAR_2000_NS:
            base = 0  # ts is already time since the epoch
        self._rows.offset = base
        self.relative_time = first is None or first + base < YEAR_2000_NS
        self.start_ns = min(max(0, first + base), MAX_NS) if first is not None else 0
        return primed

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        try:
            yield
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as error:
            raise KinetoError(f"{self.path.name}: cannot read it ({one_line(error)})") from None

    def _estimate(self, done: int) -> int:
        return max(done, done * self._scan.text_bytes // max(1, self._text.consumed))

    # -- events -------------------------------------------------------------------------------

    def _chunks(self) -> Iterator[pa.RecordBatch]:
        """Chunks of CHUNK_ROWS rows. A full chunk is held until the next one is full: GPU work
        in it can still be linked to a call read later."""
        held: Chunk | None = None
        starts: list[int] = []
        rows = self._rows
        with self._reading():
            for block in chain([self._primed], self._events):
                at = 0
                while at < len(block):
                    at = rows.add_all(block, at)
                    if len(rows.current) >= CHUNK_ROWS:
                        if held is not None:
                            yield self._release(held, starts)
                        held, rows.current = rows.current, Chunk()
        for chunk in (held, rows.current):
            if chunk is not None and len(chunk):
                yield self._release(chunk, starts)
        if starts:
            self.start_ns = min(starts)

    def _release(self, chunk: Chunk, starts: list[int]) -> pa.RecordBatch:
        batch = self._rows.release(chunk)
        starts.append(pc.min(batch.column("start")).as_py())
        return batch
