"""Runs, steps, phases and scalars from training code, on the timeline beside the GPUs.

```python
import tracehouse

with tracehouse.run("resnet50-bs256", tags={"lr": "0.1"}):
    for i, batch in enumerate(loader):
        tracehouse.step(i)
        with tracehouse.phase("forward"):
            loss = model(batch)
        tracehouse.scalar("loss", loss)
```

A run is a row of `runs` (source `user`, with host, pid, command line and the caller's tags);
each step is an event of kind `step` (named `step`, its number in the extras, from one
`step()` call to the next, or to the end of `with step(i):`), each phase an event of kind
`phase` (its nesting depth on its thread in `depth`), each scalar a sample of the run's
host (gpu -1, this process's pid) named as given.

The caller's thread only appends a tuple to a bounded deque (a full one drops the record and
counts it) and never raises: a failure is logged once and the call returns. A daemon thread
turns the records into batches (the agent's Batcher) that the agent's Shipper sends, with a
disk Spool of the run's own (`$TRACEHOUSE_HOME/spool/runs/RUN_ID.SESSION`, which also names
the server it is for) while the server is away. Batch ids are `RUN_ID/SESSION/SEQUENCE`, the
session (`STARTHEX.PID`) telling apart processes given one `run_id`. At the end of a run, open
phases and the open step end with it, and what is still pending gets one try of up to
`end_timeout` seconds, which a failed send ends early; what remains stays in the spool: the
next run on this machine aimed at the same server sends it, and so does the host's agent
(`tracehouse agent`, every 30 s).

Times are the run's start on the wall clock plus the monotonic clock since then: a wall
clock set back during a run never makes an event end before it starts.

Importing this module imports neither grpc nor torch; a run imports grpc when it starts, and
torch only for NVTX (`nvtx=True`, or by default when the caller has imported torch and CUDA
is available), so that phases and steps also show up in Nsight Systems profiles.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import math
import os
import platform
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracehouse import __version__, config

if TYPE_CHECKING:
    from types import TracebackType

    from agent.batcher import Batcher
    from agent.shipper import Shipper
    from agent.spool import Spool
    from tracehouse.channel import ClientSecurity

log = logging.getLogger("tracehouse.training")

BUFFER_RECORDS = 1 << 18  # records waiting for the worker; past this a call's record is dropped and counted
DRAIN_INTERVAL_S = 0.1  # how often the worker empties the buffer
FLUSH_INTERVAL_S = 1.0  # a batch closes after this long...
BATCH_EVENTS = 50_000  # ...or with this many events (or the Batcher's 50,000 sample values)
END_TIMEOUT_S = 5.0  # at the end of a run: time for the pending batches to reach a server that answers
CALL_TIMEOUT_S = 5.0  # one Write
STEP_STARTS_KEPT = 4096  # steps whose start a late scalar(..., step=i) can still find
MAX_NAME_BYTES = 256  # metric names and tag keys (tracehouse.model.Limits.max_name_bytes)
MAX_TEXT_BYTES = 64 << 10  # event names, tag values (Limits.max_string_bytes)
STEP_NAME = "step"
MAX_ID_BYTES = 128  # batch ids (Limits.max_id_bytes)
_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,100}")
_perf_ns = time.perf_counter_ns

# records the caller's thread appends: a tag, then the fields
_STEP = 0  # (tag, t, i, tid): step i starts, the thread's previous step ends
_STEP_END = 1  # (tag, t, tid): the thread's step ends
_PHASE = 2  # (tag, start, end, name, depth, tid)
_SCALAR = 3  # (tag, t, name, value, step or None)
_THREAD = 4  # (tag, t, tid, thread name): a thread's first record

_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()
_current: Run | None = None
_runs: list[Run] = []  # runs started and not ended, oldest first: the last is the current one
_registry_lock = threading.Lock()
_atexit_registered = False
_said_no_run = False


def _fits(text: str, limit: int) -> bool:
    """Whether `text` takes at most `limit` bytes in UTF-8 (without encoding it when it is short)."""
    return len(text) * 4 <= limit or len(text.encode()) <= limit


def _clean_map(mapping: Mapping[Any, Any] | None, what: str) -> dict[str, str]:
    """Keys and values as strings within the store's limits; what does not fit is logged and left out."""
    clean: dict[str, str] = {}
    for key, value in (mapping or {}).items():
        key, value = str(key), str(value)
        if not key or not _fits(key, MAX_NAME_BYTES) or not _fits(value, MAX_TEXT_BYTES):
            log.warning("tracehouse: %s %r left out: keys are 1..%d bytes, values up to %d", what, key[:64],
                        MAX_NAME_BYTES, MAX_TEXT_BYTES)  # fmt: skip
            continue
        clean[key] = value
    return dict(list(clean.items())[:256])


def _run_id(name: str, host: str, started_ns: int, pid: int) -> str:
    """NAME.HOST.STAMP.PID, as the agent names its runs plus the pid: unique per process."""
    from tracehouse.ids import make_run_id

    return f"{make_run_id(name[:40], host[:40], started_ns)}.{pid}"


def _batch_prefix(run_id: str, session: str) -> str:
    """RUN_ID/SESSION, the run id cut short where the batch ids (PREFIX/SEQUENCE, 8 digits)
    would pass MAX_ID_BYTES: the session alone tells the run's batches from others'."""
    room = MAX_ID_BYTES - len("/00000000") - len("/") - len(session)
    return f"{run_id[:room]}/{session}"


class _CudaValue:
    """A CUDA tensor's value on its way to the host: the worker waits for `ready` before reading `value`."""

    __slots__ = ("ready", "value")

    def __init__(self, value: Any, ready: Any) -> None:
        self.value = value
        self.ready = ready


def _snapshot(tensor: Any) -> Any:
    """A tensor's value as it is now, taken on the caller's thread (the caller may change the
    tensor in place before the worker reads it): a detached copy; for a CUDA tensor, a copy to
    the host started now, without waiting for it, and an event that marks its end. A tensor
    of more than one element is not copied: it is refused as invalid anyway."""
    detached = tensor.detach()
    numel = getattr(detached, "numel", None)
    if numel is not None and numel() != 1:
        return detached
    if getattr(detached, "is_cuda", False):
        copied = detached.to("cpu", non_blocking=True)
        ready = sys.modules["torch"].cuda.Event()
        ready.record()
        return _CudaValue(copied, ready)
    return detached.clone()


class _Phase:
    """One `with phase(name):`. A phase takes the lowest depth on its thread that no open
    phase holds: nested phases get 0, 1, 2, ..., and phases closed out of order never share
    a lane while both are open."""

    __slots__ = ("_entered", "_pushed", "_run", "_stack", "closed", "depth", "name", "start", "tid")

    def __init__(self, run: Run, name: str) -> None:
        self._run = run
        self.name = name
        self.closed = False  # the run ended while it was open: its record is written
        self._entered = False  # recorded at its exit only when its start went well
        self._pushed = False
        self.start = 0
        self.depth = 0
        self.tid = 0

    def __enter__(self) -> _Phase:
        run = self._run
        self.start = _perf_ns() + run._base_ns
        try:
            local = run._local
            try:
                stack = local.stack
            except AttributeError:
                stack = run._thread_started()
            depth = 0
            if stack:
                held = {open_phase.depth for open_phase in stack}
                while depth in held:
                    depth += 1
            self.depth = depth
            self.tid = local.tid
            self._stack = stack
            if run._nvtx is not None:
                run._nvtx.range_push(self.name)
                self._pushed = True
            stack.append(self)
            self._entered = True
        except Exception as error:
            run._failed(error)
        return self

    def __exit__(self, *exc: object) -> None:
        run = self._run
        end = _perf_ns() + run._base_ns
        if not self._entered:
            return
        try:
            stack = self._stack
            if stack and stack[-1] is self:
                stack.pop()
            elif self in stack:
                stack.remove(self)
            if self._pushed:
                run._nvtx.range_pop()
            if not self.closed and run._open:
                buffer = run._buffer
                if len(buffer) < BUFFER_RECORDS:
                    buffer.append((_PHASE, self.start, end, self.name, self.depth, self.tid))
                else:
                    run.dropped += 1
        except Exception as error:
            run._failed(error)


class _StepEnd:
    """What `step(i)` returns: `with step(i):` ends the step at the end of the block."""

    __slots__ = ("_run",)

    def __init__(self, run: Run) -> None:
        self._run = run

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._run._end_step()


class Run:
    """Start a run and make it the current one (`step`, `phase` and `scalar` record into it);
    use it with `with`, or call `.end()`. Never raises for a server that is away.
    `tracehouse.run` is this class.

    server: host:port of `tracehouse serve` (default $TRACEHOUSE_SERVER or 127.0.0.1:50051);
    security: its credentials (default from the TRACEHOUSE_TOKEN_FILE and TRACEHOUSE_TLS_*
    variables); run_id: instead of NAME.HOST.START.PID (processes given one id each send
    batches of their own); host: instead of this machine's name; spool: the folder of the
    runs' spools (default $TRACEHOUSE_HOME/spool/runs); nvtx: also emit NVTX ranges (default:
    where torch is imported and CUDA available); enabled: False records nothing (say, on all
    ranks but one); flush_interval: seconds a batch stays open; end_timeout: seconds the end
    tries to ship what is pending; spool_max_bytes: bound on the run's spool (the oldest
    batches go first, counted)."""

    def __init__(
        self,
        name: str,
        tags: Mapping[str, Any] | None = None,
        server: str | None = None,
        *,
        run_id: str | None = None,
        host: str | None = None,
        security: ClientSecurity | None = None,
        spool: Path | str | None = None,
        nvtx: bool | None = None,
        enabled: bool = True,
        flush_interval: float = FLUSH_INTERVAL_S,
        end_timeout: float = END_TIMEOUT_S,
        spool_max_bytes: int = 1 << 30,
    ) -> None:
        self.name = str(name)
        self.tags = _clean_map(tags, "tag")
        self.host = host or socket.gethostname()
        self.pid = os.getpid()
        self.started_ns = time.time_ns()
        self._base_ns = self.started_ns - _perf_ns()  # the run's clock: _perf_ns() + _base_ns
        self.session = f"{self.started_ns:x}.{self.pid}"
        if run_id is not None and not _RUN_ID.fullmatch(run_id):
            log.warning("tracehouse: run id %r is not 1..100 characters of [A-Za-z0-9._:-]; making one", run_id[:200])
            run_id = None
        self.run_id = run_id or _run_id(self.name, self.host, self.started_ns, self.pid)
        self.server = server or config.default_server()
        self.spool_root = Path(spool).expanduser() if spool is not None else config.default_spool() / "runs"
        self.dropped = 0  # records the full buffer had no room for
        self.failures = 0  # calls that failed inside tracehouse (logged once)
        self._buffer: collections.deque[tuple[Any, ...]] = collections.deque()
        self._local = threading.local()
        self._stacks: dict[int, list[_Phase]] = {}  # open phases per thread
        self._step_end = _StepEnd(self)
        self._open = False  # records are taken
        self._ended = False
        self._end_lock = threading.Lock()
        self._stop = threading.Event()
        self._status = "ok"
        self._end_ns: int | None = None
        self._flush_interval = flush_interval
        self._end_timeout = end_timeout
        self._spool_max_bytes = spool_max_bytes
        self._security = security
        self._nvtx: Any = None  # torch.cuda.nvtx when NVTX ranges are emitted
        self._counts = {"steps": 0, "phases": 0, "scalars": 0, "invalid": 0, "stored_batches": 0, "dropped_batches": 0}
        self._worker: threading.Thread | None = None
        if enabled:
            try:
                self._start(nvtx)
            except Exception as error:  # the run records nothing, the training goes on
                log.error("tracehouse: run %s records nothing: %s", self.run_id, error, exc_info=True)
                self._open = False

    # -- the caller's side: append a record and return ------------------------------------------

    def step(self, i: int) -> _StepEnd:
        """Step `i` starts now; the previous step of this thread ends. `with run.step(i):`
        ends it at the end of the block instead."""
        if self._open:
            try:
                local = self._local
                try:
                    tid = local.tid
                except AttributeError:
                    self._thread_started()
                    tid = local.tid
                buffer = self._buffer
                if len(buffer) < BUFFER_RECORDS:
                    buffer.append((_STEP, _perf_ns() + self._base_ns, i, tid))
                else:
                    self.dropped += 1
                if self._nvtx is not None:
                    self._nvtx_step(i)
            except Exception as error:
                self._failed(error)
        return self._step_end

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """`with run.phase("forward"):` records the block as a phase."""
        return _Phase(self, name) if self._open else _NOTHING

    def scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """A value of the series `name` (loss, learning rate, throughput) now, or at the start
        of step `step` when given. A tensor is copied as it is now (a CUDA tensor's copy to
        the host is started, not waited for) and read on tracehouse's thread."""
        if self._open:
            try:
                t = _perf_ns() + self._base_ns
                if hasattr(value, "detach"):
                    value = _snapshot(value)
                buffer = self._buffer
                if len(buffer) < BUFFER_RECORDS:
                    buffer.append((_SCALAR, t, name, value, step))
                else:
                    self.dropped += 1
            except Exception as error:
                self._failed(error)

    def _end_step(self) -> None:
        if self._open:
            try:
                buffer = self._buffer
                if len(buffer) < BUFFER_RECORDS:
                    buffer.append((_STEP_END, _perf_ns() + self._base_ns, self._local.tid))
                else:
                    self.dropped += 1
                if self._nvtx is not None:
                    self._nvtx_step(None)
            except Exception as error:
                self._failed(error)

    def _thread_started(self) -> list[_Phase]:
        """This thread's first record: its id, its stack of open phases, and its name."""
        local = self._local
        local.tid = threading.get_native_id()
        stack: list[_Phase] = []
        local.stack = stack
        local.nvtx_step = None
        self._stacks[local.tid] = stack
        self._buffer.append((_THREAD, _perf_ns() + self._base_ns, local.tid, threading.current_thread().name))
        return stack

    def _failed(self, error: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            log.warning("tracehouse: run %s: a call failed and was skipped (said once): %r", self.run_id, error)

    # -- NVTX ----------------------------------------------------------------------------------

    def _nvtx_step(self, i: int | None) -> None:
        """Steps are start/end ranges (not push/pop), so a step may begin inside a phase."""
        local = self._local
        if local.nvtx_step is not None:
            self._nvtx.range_end(local.nvtx_step)
            local.nvtx_step = None
        if i is not None:
            local.nvtx_step = self._nvtx.range_start(f"{STEP_NAME} {i}")

    # -- lifecycle -----------------------------------------------------------------------------

    def _start(self, nvtx: bool | None) -> None:
        _no_grpc_fork_handlers()
        from agent.batcher import Batcher
        from agent.runspool import replay_spools, spool_folder
        from agent.shipper import Shipper
        from agent.spool import Spool

        security = self._security if self._security is not None else _environment_security()
        self._security = security  # the end's shipper uses it too
        self._nvtx = _nvtx_module(nvtx)
        folder, self._lock_file = spool_folder(self.spool_root, f"{self.run_id}.{self.session}", self.server)
        self.spool: Spool = Spool(folder, self._spool_max_bytes, on_drop=self._batch_dropped)
        self.shipper: Shipper = Shipper(
            self.server, self.spool, on_stored=self._batch_stored, on_dropped=self._batch_dropped,
            security=security, call_timeout=CALL_TIMEOUT_S,
        )  # fmt: skip
        self.batcher: Batcher = Batcher(
            self.run_id, self.host, self.shipper.submit, max_age=self._flush_interval,
            batch_prefix=_batch_prefix(self.run_id, self.session),
        )  # fmt: skip
        self._attrs = self._start_attrs()
        self._columns = _EventColumns()
        self._open_steps: dict[int, tuple[int, Any]] = {}  # per thread: start and number of its step
        self._step_starts: dict[Any, int] = {}
        self._describe(None)
        self.batcher.flush()  # the run is on the server (or in the spool) from its first moment
        self._columns.add("process", self.started_ns, self.started_ns, _process_name(), tid=0)
        self._open = True
        self._worker = threading.Thread(target=self._work, name="tracehouse-run", daemon=True)
        self._worker.start()
        self._replayer = threading.Thread(
            target=replay_spools, args=(self.spool_root, self.server, security, self._stop, folder.name),
            name="tracehouse-replay", daemon=True,
        )  # fmt: skip
        self._replayer.start()
        _started(self)
        log.info("tracehouse: run %s -> %s", self.run_id, self.server)

    def _start_attrs(self) -> dict[str, str]:
        attrs = {
            "pid": str(self.pid),
            "python": platform.python_version(),
            "tracehouse": __version__,
            "command": " ".join(sys.argv)[:4096] or sys.executable,
        }
        torch = sys.modules.get("torch")
        if torch is not None:
            attrs["torch"] = str(getattr(torch, "__version__", "unknown"))
        if os.environ.get("TRACEHOUSE_PARENT_RUN"):  # started by `tracehouse run`
            attrs["parent_run"] = os.environ["TRACEHOUSE_PARENT_RUN"][:128]
        for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID"):
            if os.environ.get(variable):
                attrs[variable.lower()] = os.environ[variable][:1024]
        attrs["nvtx"] = "on" if self._nvtx is not None else "off"
        return attrs

    def _describe(self, end: int | None) -> None:
        attrs = dict(self._attrs)
        if end is not None:
            attrs.update(status=self._status, **{k: str(v) for k, v in self._counts.items() if "batches" not in k})
            attrs["dropped_records"] = str(self.dropped)
        self.batcher.describe_run(
            run_id=self.run_id, name=self.name, host=self.host, source="user", start=self.started_ns,
            end=end, tags=self.tags, attrs=attrs,
        )  # fmt: skip

    def _batch_stored(self, batch_id: str, values: int) -> None:
        self._counts["stored_batches"] += 1

    def _batch_dropped(self, batch_id: str, values: int) -> None:
        self._counts["dropped_batches"] += 1

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.end()
        else:
            self.end("interrupted" if issubclass(kind, KeyboardInterrupt) else f"failed: {kind.__name__}")

    def end(self, status: str = "ok") -> dict[str, Any]:
        """End the run (open phases and the open step end now), try once to ship what is
        pending within `end_timeout` seconds (a failed send ends the try: the rest stays in
        the spool) and return the counts. Ending again returns the same counts."""
        with self._end_lock:
            if self._ended:
                return self.report()
            self._ended = True
        _forget(self)
        if not self._open or self._worker is None:
            return self.report()
        now = _perf_ns() + self._base_ns
        self._status = status
        self._end_ns = now
        self._open = False
        for tid, stack in list(self._stacks.items()):
            for phase in list(stack):
                if not phase.closed:
                    phase.closed = True
                    self._buffer.append((_PHASE, phase.start, max(now, phase.start), phase.name, phase.depth, tid))
        if self._nvtx is not None:
            with contextlib.suppress(Exception):
                self._nvtx_step(None)
        self._stop.set()
        self._worker.join(self._end_timeout + CALL_TIMEOUT_S + 1)
        if self._worker.is_alive():
            log.warning("tracehouse: run %s did not finish shipping in time; the rest is lost", self.run_id)
        self._replayer.join(0.5)
        return self.report()

    def report(self) -> dict[str, Any]:
        """What the run recorded and where it went: records dropped by a full buffer, values
        refused as invalid, batches stored and batches waiting in the spool."""
        spool = getattr(self, "spool", None)
        return {
            "run_id": self.run_id,
            **self._counts,
            "dropped_records": self.dropped,
            "spooled_batches": spool.batches if spool is not None else 0,
            "spool": str(spool.folder) if spool is not None else None,
        }

    # -- the worker's side ---------------------------------------------------------------------

    def _work(self) -> None:
        try:
            while not self._stop.wait(DRAIN_INTERVAL_S):
                self._drain()
                if self.batcher.due():
                    self._flush()
        except Exception:
            log.exception("tracehouse: run %s: recording failed; the training goes on", self.run_id)
        try:
            self._finish()
        except Exception:
            log.exception("tracehouse: run %s: could not ship its end", self.run_id)

    def _drain(self) -> None:
        buffer = self._buffer
        for _ in range(len(buffer)):
            record = buffer.popleft()
            tag = record[0]
            if tag == _PHASE:
                _, start, end, name, depth, tid = record
                if self._event("phase", start, max(start, end), name, tid=tid, depth=depth):
                    self._counts["phases"] += 1
            elif tag == _STEP:
                _, t, i, tid = record
                self._close_step(tid, t)
                self._open_steps[tid] = (t, i)
                self._step_starts[i] = t
                if len(self._step_starts) > STEP_STARTS_KEPT:
                    del self._step_starts[next(iter(self._step_starts))]
            elif tag == _SCALAR:
                self._scalar(*record[1:])
            elif tag == _STEP_END:
                self._close_step(record[2], record[1])
            else:  # _THREAD
                _, t, tid, thread_name = record
                self._event("thread", t, t, thread_name, tid=tid)
            if len(self._columns) >= BATCH_EVENTS:
                self._flush()

    def _event(self, kind: str, start: int, end: int, name: Any, tid: int, depth: int = 0, **extras: str) -> bool:
        text = name if isinstance(name, str) else str(name)
        if not _fits(text, MAX_TEXT_BYTES):
            self._invalid(f"a {kind} name of {len(text.encode())} bytes (the limit is {MAX_TEXT_BYTES})")
            return False
        self._columns.add(kind, start, end, text, tid=tid, depth=depth, extras=extras)
        return True

    def _close_step(self, tid: int, t: int) -> None:
        opened = self._open_steps.pop(tid, None)
        if opened is not None:
            start, i = opened
            self._event("step", start, max(t, start), STEP_NAME, tid=tid, step=str(i))
            self._counts["steps"] += 1

    def _scalar(self, t: int, name: Any, value: Any, step: Any) -> None:
        try:
            if isinstance(value, _CudaValue):
                value.ready.synchronize()
                value = value.value
            number = float(value.item() if hasattr(value, "item") else value)
        except Exception:
            number = math.nan
        if not isinstance(name, str) or not name or not _fits(name, MAX_NAME_BYTES):
            self._invalid(f"scalar name {str(name)[:64]!r} (names are 1..{MAX_NAME_BYTES} bytes)")
        elif not math.isfinite(number):
            self._invalid(f"scalar {name!r}: {str(value)[:64]} is not a finite number")
        else:
            ts = self._step_starts.get(step, t) if step is not None else t
            self.batcher.add(ts, -1, {name: number}, pid=self.pid)
            self._counts["scalars"] += 1

    def _invalid(self, what: str) -> None:
        self._counts["invalid"] += 1
        if self._counts["invalid"] == 1:
            log.warning("tracehouse: run %s: %s left out (said once; counted in the run's attrs)", self.run_id, what)

    def _flush(self) -> None:
        """Close a batch: the events gathered since the last one, and the Batcher's samples and
        run descriptions. Events wait here, not in the Batcher, so that their count bounds a batch."""
        columns = self._columns
        if len(columns):
            self.batcher.add_events(
                columns.kind, columns.start, columns.end, columns.name, extras=columns.extras,
                pid=self.pid, tid=columns.tid, depth=columns.depth,
            )  # fmt: skip
            self._columns = _EventColumns()
        self.batcher.flush()

    def _finish(self) -> None:
        from agent.runspool import remove_spool

        self._drain()
        end = max(self.started_ns, self._end_ns if self._end_ns is not None else _perf_ns() + self._base_ns)
        for tid in list(self._open_steps):
            self._close_step(tid, end)
        self._describe(end)
        self._flush()
        self._ship_pending(time.monotonic() + self._end_timeout)
        if self.spool.batches:
            log.warning(
                "tracehouse: %d batches of run %s wait in %s (server %s away); the next run on this machine sends them",
                self.spool.batches, self.run_id, self.spool.folder, self.server,
            )  # fmt: skip
            if self._lock_file is not None:
                self._lock_file.close()  # the spool is the next run's to send
        else:
            remove_spool(self.spool.folder, self._lock_file)

    def _ship_pending(self, deadline: float) -> None:
        """The end's one try: ship what is pending until the deadline, or until a send fails.
        While the server answers (nothing is spooled), the shipper's thread goes on, and a
        send that fails spools what is queued, which ends the try. Where the server was away
        before the end (the shipper may be waiting out a long backoff), a shipper of the end's
        own tries the spool at once, oldest batch first, until a send fails."""
        from agent.shipper import Outcome, Shipper

        shipper = self.shipper
        away_before = self.spool.batches > 0
        while not self.spool.batches and shipper.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        failed_now = not away_before and self.spool.batches > 0
        shipper.shutdown(0.0)  # stops its thread; what is still queued goes to the spool
        if failed_now or not self.spool.batches or time.monotonic() >= deadline:
            return
        failed = threading.Event()

        def on_write(_seconds: float, outcome: Outcome) -> None:
            if outcome is Outcome.RETRY:
                failed.set()

        retry = Shipper(
            self.server, self.spool, on_stored=self._batch_stored, on_dropped=self._batch_dropped,
            security=self._security, call_timeout=CALL_TIMEOUT_S,
        )  # fmt: skip
        retry.on_write = on_write
        while self.spool.batches and time.monotonic() < deadline and not failed.wait(0.01):
            pass
        retry.shutdown(0.0)


class _EventColumns:
    """Events as columns, ready for Batcher.add_events."""

    def __init__(self) -> None:
        self.kind: list[str] = []
        self.start: list[int] = []
        self.end: list[int] = []
        self.name: list[str] = []
        self.tid: list[int] = []
        self.depth: list[int] = []
        self.extras: list[dict[str, str]] = []

    def __len__(self) -> int:
        return len(self.start)

    def add(
        self, kind: str, start: int, end: int, name: str, tid: int, depth: int = 0, extras: dict[str, str] | None = None
    ) -> None:
        self.kind.append(kind)
        self.start.append(start)
        self.end.append(end)
        self.name.append(name)
        self.tid.append(tid)
        self.depth.append(depth)
        self.extras.append(extras or {})


# -- the module's API: the current run ---------------------------------------------------------


run = Run  # `tracehouse.run(...)`: a run is started by creating it


def current() -> Run | None:
    return _current


def step(i: int) -> contextlib.AbstractContextManager[Any]:
    """Step `i` of the current run starts now (the previous one ends); see Run.step."""
    active = _current
    if active is None:
        return _no_run()
    return active.step(i)


def phase(name: str) -> contextlib.AbstractContextManager[Any]:
    """`with tracehouse.phase("dataloader"):` records the block in the current run."""
    active = _current
    if active is None:
        return _no_run()
    return active.phase(name)


def scalar(name: str, value: Any, step: int | None = None) -> None:
    """A value of the series `name` in the current run; see Run.scalar."""
    active = _current
    if active is None:
        _no_run()
        return
    active.scalar(name, value, step)


def _no_run() -> contextlib.nullcontext[None]:
    global _said_no_run
    if not _said_no_run:
        _said_no_run = True
        log.info("tracehouse: step/phase/scalar outside a run record nothing (start one with tracehouse.run)")
    return _NOTHING


def _started(started: Run) -> None:
    global _current, _atexit_registered
    with _registry_lock:
        if not _atexit_registered:
            atexit.register(_end_all)
            _atexit_registered = True
        earlier = _current
        _current = started
        _runs.append(started)
    if earlier is not None and not earlier._ended:
        log.info("tracehouse: run %s is now the current run (%s goes on)", started.run_id, earlier.run_id)


def _forget(ended: Run) -> None:
    global _current
    with _registry_lock:
        if ended in _runs:
            _runs.remove(ended)
        if _current is ended:
            _current = _runs[-1] if _runs else None  # the most recent run that goes on


def _end_all() -> None:
    for left in reversed(list(_runs)):
        left.end("ended at exit")


def _no_grpc_fork_handlers() -> None:
    """Turn gRPC's fork handlers off (GRPC_ENABLE_FORK_SUPPORT=false) unless the caller set
    them or grpc is already imported: with a run's shipper calling into gRPC, a fork (a
    DataLoader's workers) skips them, and some children crashed (8 of 50 runs with two fork
    workers each, against none of 50 with the handlers off). The children record nothing."""
    if "grpc" not in sys.modules:
        os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


def _after_fork() -> None:
    """A forked child (a DataLoader worker) has none of the runs' threads: it records nothing."""
    global _current
    for inherited in list(_runs):
        inherited._open = False
        inherited._ended = True
    _runs.clear()
    _current = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


# -- helpers -----------------------------------------------------------------------------------


def _environment_security() -> ClientSecurity | None:
    from tracehouse.channel import client_security
    from tracehouse.security import SecurityError

    try:
        return client_security()
    except SecurityError as error:
        log.error("tracehouse: %s; sending without credentials (the server may refuse: batches wait in the spool)",
                  error)  # fmt: skip
        return None


def _nvtx_module(wanted: bool | None) -> Any:
    """torch.cuda.nvtx when NVTX ranges are wanted and work; None otherwise. By default
    (None) only where the caller has imported torch and CUDA is available."""
    if wanted is False:
        return None
    torch = sys.modules.get("torch")
    try:
        if wanted is None and (torch is None or not torch.cuda.is_available()):
            return None
        import torch.cuda.nvtx as nvtx

        nvtx.range_push("tracehouse")  # a CPU-only build has the module but raises here
        nvtx.range_pop()
        return nvtx
    except Exception as error:
        log.warning("tracehouse: no NVTX ranges (%s)", error)
        return None


def _process_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
