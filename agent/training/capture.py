"""Captures on demand in the training process: a profile of the steps a request names, imported
into the process's own run.

The server says in the answer to a write that a capture of the run is asked for
(WriteResponse.capture_waiting); the run's worker thread then asks Capture.Poll for its orders
over the channel the run already has, checks that a profiler can be made, and arms the run. The
caller's thread starts the profiler when the asked step begins (`Run.step`) and stops it when
the last one ends; a thread of its own writes the trace, and a process of its own
(agent/training/capture_import.py, at a lower priority) imports it into the run. A run never
asked pays one attribute test a step.

A profiler is anything with `prepare()` (its warm-up, off the loop), `start()`, `stop()` and
`export(path)` (a Kineto JSON trace):
`TorchProfiler` (torch.profiler, CUDA activity where there is a GPU) by default, or what the
run's `capture_profiler=` makes (`RecordingProfiler`, where torch cannot be installed).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.training.records import log

REPORT_TIMEOUT_S = 5.0
ARMED_FOR_S = 120.0  # an order whose first step has not begun by then fails (the loop's numbers went elsewhere)
MAX_CAPTURE_S = 600.0  # a capture stops at the first step boundary past this, whatever it was asked
IMPORT_TIMEOUT_S = 1800.0


class CaptureUnavailable(Exception):
    """No profiler can be made in this process; the message says why."""


class Profiler(Protocol):
    def prepare(self) -> None: ...  # on tracehouse's thread, when the order arrives
    def start(self) -> None: ...  # on the training loop's, at the step asked
    def stop(self) -> None: ...
    def export(self, path: Path) -> None: ...


class TorchProfiler:
    """torch.profiler with CPU activity, and CUDA activity where CUDA is available."""

    def __init__(self) -> None:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile
        except ImportError as error:
            raise CaptureUnavailable(f"torch is not installed in the training process ({error})") from None

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._profile = profile(activities=activities)

    def prepare(self) -> None:
        """Kineto's warm-up: 2.4 s the first time on a machine without a GPU, most of it without the GIL."""
        self._profile.prepare_trace()

    def start(self) -> None:
        self._profile.start_trace()  # 0.2 ms once prepared

    def stop(self) -> None:
        self._profile.stop_trace()

    def export(self, path: Path) -> None:
        self._profile.export_chrome_trace(str(path))


class RecordingProfiler:
    """Records what it was asked (start, stop, on which thread) and exports it as a Kineto trace
    of one CPU range over the profiled time, for where torch is not installed."""

    def __init__(self) -> None:
        self.started_ns = 0
        self.stopped_ns = 0
        self.tid = 0

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        self.started_ns = time.time_ns()
        self.tid = threading.get_native_id()

    def stop(self) -> None:
        self.stopped_ns = time.time_ns()

    def export(self, path: Path) -> None:
        pid, origin = os.getpid(), self.started_ns - 1000
        events = [
            {"ph": "X", "cat": "cpu_op", "name": "recorded", "pid": pid, "tid": self.tid,
             "ts": (self.started_ns - origin) / 1000, "dur": (self.stopped_ns - self.started_ns) / 1000, "args": {}},
        ]  # fmt: skip
        trace = {"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": origin}
        path.write_text(json.dumps(trace))


class Capture:
    """One order in this process: armed, capturing, then handed to its import thread."""

    def __init__(self, request_id: str, first_step: int, steps: int, seconds: float, profiler: Profiler) -> None:
        self.request_id = request_id
        self.first_step = first_step
        self.steps = steps
        self.seconds = seconds
        self.profiler = profiler
        self.capturing = False
        self.started = -1  # the first step captured
        self.current = -1
        self.count = 0  # steps begun since the start: numbers may start over (a new epoch's enumerate)
        self.armed_at = time.monotonic()
        self.started_at = 0.0
        self.note = ""


class Capturer:
    """The run's side of captures: `step(i)` and `step_ended()` on the caller's thread, `poll()`
    on the worker's, `finish()` at the run's end. `report(...)` tells the server."""

    def __init__(self, run: Any, make_profiler: Callable[[], Profiler] | None) -> None:
        self._run = run
        self._make_profiler = make_profiler or TorchProfiler
        self.rank = _rank()
        self.asked = threading.Event()  # set by the shipper when a write's answer says a capture waits
        self._taken: set[str] = set()
        self._imports: list[threading.Thread] = []
        self._stub: Any = None
        self.closed = False  # the run is ending: no more orders

    # -- the worker's thread ------------------------------------------------------------------

    def poll(self) -> None:
        """Ask for this process's orders; arm the run with the first that a profiler can take."""
        self.asked.clear()
        if self.closed:
            return
        from tracehouse.v1 import capture_pb2

        run = self._run
        try:
            answer = self._capture_stub().Poll(
                capture_pb2.CapturePoll(run_id=run.run_id, session=run.session, rank=self.rank, step=-1),
                timeout=REPORT_TIMEOUT_S, metadata=run.shipper.metadata,
            )  # fmt: skip
        except Exception as error:
            log.info("tracehouse: run %s: could not ask for its capture orders: %s", run.run_id, error)
            return
        for order in answer.orders:
            if order.request_id in self._taken:
                continue
            self._taken.add(order.request_id)
            if run._capture is not None:
                self.report(order.request_id, "failed", reason="another capture is under way in this process")
                continue
            try:
                profiler = self._make_profiler()
                profiler.prepare()
            except Exception as error:
                self.report(order.request_id, "failed", reason=f"no profiler: {error}"[:1024])
                continue
            run._capture = Capture(order.request_id, order.first_step, order.steps, order.seconds, profiler)
            self.report(order.request_id, "taken", first_step=order.first_step)

    def _capture_stub(self) -> Any:
        if self._stub is None:
            from tracehouse.v1 import capture_pb2_grpc

            self._stub = capture_pb2_grpc.CaptureStub(self._run.shipper.channel)
        return self._stub

    def report(self, request_id: str, state: str, first_step: int = -1, last_step: int = -1,
               trace_bytes: int = 0, events: int = 0, reason: str = "") -> None:  # fmt: skip
        from tracehouse.v1 import capture_pb2

        run = self._run
        message = capture_pb2.CaptureReport(
            request_id=request_id, run_id=run.run_id, session=run.session, rank=self.rank, host=run.host,
            state=state, first_step=first_step, last_step=last_step, trace_bytes=trace_bytes, events=events,
            reason=reason,
        )  # fmt: skip
        try:
            self._capture_stub().Report(message, timeout=REPORT_TIMEOUT_S, metadata=run.shipper.metadata)
        except Exception as error:
            log.warning("tracehouse: run %s: capture %s is %s, but the server was not told: %s",
                        run.run_id, request_id, state, error)  # fmt: skip

    # -- the caller's thread ------------------------------------------------------------------

    def step(self, capture: Capture, i: int) -> None:
        """Step `i` begins: start the profiler at the asked step; stop it after as many steps as asked
        (counted, not read off the numbers), or at the first step past the seconds asked or MAX_CAPTURE_S."""
        now = time.monotonic()
        if not capture.capturing:
            restarted = 0 <= i < capture.current  # the numbers started over (a new epoch's enumerate)
            capture.current = i
            if capture.first_step >= 0 and i < capture.first_step and not restarted:
                if now - capture.armed_at > ARMED_FOR_S:
                    self._run._capture = None
                    self._later(self.report, capture.request_id, "failed",
                                reason=f"step {capture.first_step} did not begin within {ARMED_FOR_S:g} s "
                                f"(the loop was at step {i})")  # fmt: skip
                return
            if restarted and capture.first_step >= 0 and i < capture.first_step:
                capture.note = f"the step numbers started over before step {capture.first_step}; started at step {i}"
            elif capture.first_step >= 0 and i > capture.first_step:
                capture.note = f"step {capture.first_step} had begun before the order arrived; started at step {i}"
            try:
                capture.profiler.start()
            except Exception as error:
                self._run._capture = None
                self._later(self.report, capture.request_id, "failed", reason=f"the profiler did not start: {error}")
                return
            capture.capturing, capture.started, capture.current, capture.count = True, i, i, 1
            capture.started_at = now
            self._later(self.report, capture.request_id, "capturing", i)
            return
        elapsed = now - capture.started_at
        if (
            (capture.steps and capture.count >= capture.steps)
            or (not capture.steps and elapsed >= capture.seconds)
            or elapsed >= MAX_CAPTURE_S
        ):
            self._stop(capture, capture.current)
        else:
            capture.current = i
            capture.count += 1

    def step_ended(self, capture: Capture) -> None:
        """`with step(i):` ended: stop when it was the last step asked."""
        if capture.capturing and capture.steps and capture.count >= capture.steps:
            self._stop(capture, capture.current)

    def finish(self, deadline: float) -> None:
        """The run ends: no more orders; a capture under way stops with the steps it has; an armed one
        fails. Then wait until `deadline` (monotonic) for the imports and their reports, which go over
        the run's channel, closed at the end."""
        self.closed = True
        capture = self._run._capture
        if capture is not None:
            if capture.capturing:
                self._stop(capture, capture.current)
            else:
                self._run._capture = None
                step = f"step {capture.first_step}" if capture.first_step >= 0 else "its next step"
                self.report(capture.request_id, "failed", reason=f"the run ended before {step}")
        for thread in self._imports:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _stop(self, capture: Capture, last: int) -> None:
        self._run._capture = None
        try:
            capture.profiler.stop()
        except Exception as error:
            self._later(self.report, capture.request_id, "failed", reason=f"the profiler failed to stop: {error}")
            return
        self._later(self._import, capture, last)

    def _later(self, work: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Off the caller's thread: a report or an import never holds the training loop."""
        thread = threading.Thread(target=work, args=args, kwargs=kwargs, name="tracehouse-capture", daemon=True)
        self._imports = [t for t in self._imports if t.is_alive()]
        self._imports.append(thread)
        thread.start()

    # -- the capture's own thread -------------------------------------------------------------

    def _import(self, capture: Capture, last: int) -> None:
        """Write the trace (the profiler's own export) and import it into the run in a process of its
        own (agent/training/capture_import.py), so that reading it costs the training process nothing."""
        run = self._run
        folder = Path(tempfile.mkdtemp(prefix="tracehouse-capture-"))
        path = folder / f"{capture.request_id}.json"
        steps = {"first_step": capture.started, "last_step": last}
        try:
            capture.profiler.export(path)
            size = path.stat().st_size
            events = self._import_apart(path, capture.request_id)
        except Exception as error:
            log.warning("tracehouse: run %s: capture %s not imported: %s", run.run_id, capture.request_id, error)
            self.report(capture.request_id, "failed", **steps, reason=f"not imported: {error}"[:1024])
            return
        finally:
            for leftover in folder.iterdir():
                leftover.unlink()
            folder.rmdir()
        run._counts["captures"] = run._counts.get("captures", 0) + 1
        self.report(capture.request_id, "imported", **steps, trace_bytes=size, events=events, reason=capture.note)

    def _import_apart(self, path: Path, request_id: str) -> int:
        run = self._run
        security = run._security
        prefix = "capture/" + hashlib.blake2b(f"{run.run_id}/{run.session}/{request_id}".encode(),
                                              digest_size=12).hexdigest()  # fmt: skip
        argv = [sys.executable, "-m", "agent.training.capture_import", str(path), "--run-id", run.run_id,
                "--host", run.host, "--prefix", prefix, "--server", run.server]  # fmt: skip
        environment = {**os.environ, **(security.environment() if security is not None else {})}
        token = (security.token or "") if security is not None else ""
        done = subprocess.run(argv, input=token + "\n", capture_output=True, text=True, env=environment,
                              timeout=IMPORT_TIMEOUT_S, check=False)  # fmt: skip
        lines = done.stdout.strip().splitlines()
        answer = (
            json.loads(lines[-1]) if lines else {"error": done.stderr.strip()[-500:] or f"status {done.returncode}"}
        )
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return int(answer["events"])


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0
