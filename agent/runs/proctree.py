"""The processes of a run: the processes started for it and every descendant, followed as
they appear, with when each was seen first and last.

Children are read from /proc/PID/task/TID/children where Linux has it (a few small reads
per process), else from one scan of every process per walk.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger("tracehouse.run")


@dataclass
class TreeProcess:
    pid: int
    ppid: int
    name: str
    first_ns: int  # its start, from the kernel where it tells
    last_ns: int  # when it was last seen alive
    gone: bool = False


class ProcessTree:
    """Call `poll()` now and then: it adds the roots' descendants not seen yet, and marks those
    gone. A pid seen once stays in `processes` (its end is the last time it was seen)."""

    def __init__(self, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.processes: dict[int, TreeProcess] = {}
        self._handles: dict[int, psutil.Process] = {}
        self._wall_ns = wall_ns
        self._proc_lists_children = True  # until a process is found whose children /proc does not list

    def add_root(self, pid: int) -> None:
        """A process of the tree: the command started, or an orphan of it this process adopted."""
        self._track(pid, self._wall_ns())

    def _track(self, pid: int, now: int, handle: psutil.Process | None = None) -> None:
        if pid in self._handles:
            return
        try:
            handle = handle or psutil.Process(pid)
            with handle.oneshot():
                name, ppid, created = handle.name(), handle.ppid(), handle.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return
        previous = self.processes.get(pid)
        if previous is not None and not previous.gone:
            return
        first = min(now, int(created * 1e9))
        self.processes[pid] = TreeProcess(pid, ppid, name, first, now)
        self._handles[pid] = handle

    def poll(self) -> None:
        now = self._wall_ns()
        parents: dict[int, list[int]] | None = None
        waiting = list(self._handles)
        while waiting:
            pid = waiting.pop()
            handle = self._handles[pid]
            try:
                alive = handle.status() != psutil.STATUS_ZOMBIE
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                alive = False
            if not alive:
                self.processes[pid].gone = True
                del self._handles[pid]
                continue
            self.processes[pid].last_ns = now
            children = _proc_children(pid) if self._proc_lists_children else None
            if children is None:
                self._proc_lists_children = not Path(f"/proc/{pid}").is_dir()  # not gone: not listed here
                parents = parents if parents is not None else _children_by_parent()
                children = parents.get(pid, [])
            for child in children:
                if child not in self._handles:
                    self._track(child, now)
                    if child in self._handles:
                        waiting.append(child)

    def signal(self, number: int) -> None:
        """Send a signal to every process of the tree still running (a pid reused since is
        left alone: psutil checks the process's start time)."""
        for handle in list(self._handles.values()):
            with contextlib.suppress(psutil.Error):
                handle.send_signal(number)

    def alive(self) -> list[int]:
        return sorted(self._handles)

    def close(self, pids: Iterable[int] = ()) -> None:
        """The run is over: processes still alive end now; `pids` are known to have exited."""
        now = self._wall_ns()
        for pid in pids:
            if pid in self.processes:
                self.processes[pid].gone = True
        for pid in list(self._handles):
            self.processes[pid].last_ns = now
            del self._handles[pid]


def _proc_children(pid: int) -> list[int] | None:
    """Direct children from /proc; None where they cannot be read that way."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return [int(child) for task in tasks for child in (task / "children").read_text().split()]
    except (OSError, ValueError):
        return None


def _children_by_parent() -> dict[int, list[int]]:
    parents: dict[int, list[int]] = {}
    for process in psutil.process_iter(["ppid"]):
        parents.setdefault(process.info["ppid"], []).append(process.pid)
    return parents
