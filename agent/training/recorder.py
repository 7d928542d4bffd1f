"""Run: a run's start (its spool, shipper, batcher and threads), the caller's side of step,
phase and scalar (append a record to the bounded buffer and return, never raise), NVTX
ranges, and its end and report."""

from __future__ import annotations

import collections
import contextlib
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.training.capture import Capture, Capturer, Profiler
from agent.training.current_run import _forget, _started
from agent.training.phases import _Phase, _StepEnd
from agent.training.records import (
    _NOTHING,
    _PHASE,
    _RUN_ID,
    _SCALAR,
    _STEP,
    _STEP_END,
    _THREAD,
    BUFFER_RECORDS,
    CALL_TIMEOUT_S,
    END_TIMEOUT_S,
    FLUSH_INTERVAL_S,
    STEP_NAME,
    _batch_prefix,
    _clean_map,
    _EventColumns,
    _perf_ns,
    _run_id,
    log,
)
from agent.training.torch_support import _nvtx_module, _snapshot
from agent.training.worker import _RunWorker
from tracehouse import __version__, config
from tracehouse.jobs import job_from_environment

if TYPE_CHECKING:
    from types import TracebackType

    from agent.shipping.batcher import Batcher
    from agent.shipping.shipper import Shipper
    from agent.shipping.spool import Spool
    from tracehouse.channel import ClientSecurity


class Run(_RunWorker):
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
    batches go first, counted); capture_profiler: makes the profiler of a capture asked with
    `tracehouse capture` (default: torch.profiler; see agent/training/capture.py); job: the distributed
    job this process is a rank of (default: from RANK, WORLD_SIZE, LOCAL_RANK and the torchrun, Slurm or
    MPI variables; tracehouse/jobs.py)."""

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
        capture_profiler: Callable[[], Profiler] | None = None,
        job: str | None = None,
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
        self._capture: Capture | None = None  # a capture armed or under way (agent/training/capture.py)
        self._capturer: Capturer | None = None
        self._capture_profiler = capture_profiler
        self._job = job
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
                capture = self._capture
                if capture is not None:
                    self._capturer.step(capture, i)  # type: ignore[union-attr]
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
                capture = self._capture
                if capture is not None:
                    self._capturer.step_ended(capture)  # type: ignore[union-attr]
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
        from agent.runs.runspool import replay_spools, spool_folder
        from agent.shipping.batcher import Batcher
        from agent.shipping.shipper import Shipper
        from agent.shipping.spool import Spool

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
        self._capturer = Capturer(self, self._capture_profiler)
        self.shipper.on_capture_waiting = self._capturer.asked.set
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
        membership = job_from_environment(os.environ, self._job)
        if membership is not None:
            attrs.update(membership.attrs())
        return attrs

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
        if self._capturer is not None:
            try:
                self._capturer.finish(time.monotonic() + self._end_timeout)
            except Exception as error:
                log.warning("tracehouse: run %s: its capture did not finish: %s", self.run_id, error)
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


# -- helpers -----------------------------------------------------------------------------------


def _no_grpc_fork_handlers() -> None:
    """Turn gRPC's fork handlers off (GRPC_ENABLE_FORK_SUPPORT=false) unless the caller set
    them or grpc is already imported: with a run's shipper calling into gRPC, a fork (a
    DataLoader's workers) skips them, and some children crashed (8 of 50 runs with two fork
    workers each, against none of 50 with the handlers off). The children record nothing."""
    if "grpc" not in sys.modules:
        os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


def _environment_security() -> ClientSecurity | None:
    from tracehouse.channel import client_security
    from tracehouse.security import SecurityError

    try:
        return client_security()
    except SecurityError as error:
        log.error("tracehouse: %s; sending without credentials (the server may refuse: batches wait in the spool)",
                  error)  # fmt: skip
        return None


def _process_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
