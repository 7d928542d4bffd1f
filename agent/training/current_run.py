"""The current run: the runs started and not ended (the most recent is the current one),
`current`, `step`, `phase` and `scalar` on it, their end at exit, and none in a forked child."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any

from agent.training.records import _NOTHING, log

if TYPE_CHECKING:
    from agent.training.recorder import Run

_current: Run | None = None
_runs: list[Run] = []  # runs started and not ended, oldest first: the last is the current one
_registry_lock = threading.Lock()
_atexit_registered = False
_said_no_run = False


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
