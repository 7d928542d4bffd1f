"""The context managers the caller's thread enters: `with phase(name):` and `with step(i):`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.training.records import _PHASE, BUFFER_RECORDS, _perf_ns

if TYPE_CHECKING:
    from agent.training.recorder import Run


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
