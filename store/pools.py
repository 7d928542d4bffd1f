"""The store's clients, in pools: one for writes (and the reads they need) and one for tracehouse's
own reads, so that a write never waits behind a reader. A reader's session keeps its bounds and, in
this process, runs at the lowest CPU priority where that priority can be given back."""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from tracehouse.model import Limits

READER_NICE = 19  # the nice value of the engine threads that run a read: the lowest priority


class PoolFull(Exception):
    """Every client of a pool stayed taken for as long as the caller would wait."""


class ClientPool:
    """A few clients shared by threads; a client that failed is closed and replaced,
    since a failed query can leave unread data on its connection."""

    def __init__(self, connect: Any, size: int) -> None:
        self._connect = connect
        self._idle: queue.LifoQueue[Client] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._all: set[Client] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def client(self, wait_s: float | None = None) -> Iterator[Client]:
        """A client once one is free, waited for `wait_s` at most (None: as long as it takes)."""
        if not self._slots.acquire(timeout=wait_s):
            raise PoolFull
        try:
            try:
                client = self._idle.get_nowait()
            except queue.Empty:
                client = self._connect()
                with self._lock:
                    self._all.add(client)
            try:
                yield client
            except ClickHouseError:
                self._discard(client)
                raise
            finally:
                if client in self._all:
                    self._idle.put(client)
        finally:
            self._slots.release()

    def _discard(self, client: Client) -> None:
        with self._lock:
            self._all.discard(client)  # not put back: the finally clause sees it gone
        with contextlib.suppress(Exception):
            client.close()

    def close(self) -> None:
        with self._lock:
            clients, self._all = list(self._all), set()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()


def reader_settings(limits: Limits) -> dict[str, Any]:
    """What each reader's session keeps: its bounds (its clients run nothing else)."""
    return {
        "max_execution_time": limits.query_max_seconds,
        "max_memory_usage": limits.query_max_memory_bytes // max(1, limits.query_max_concurrent),
        "max_threads": limits.query_max_threads or max(1, len(os.sched_getaffinity(0)) // 2),
    }


@functools.cache
def can_renice() -> bool:
    """Whether this process may give a thread back the priority it lowered (CAP_SYS_NICE, as root): the
    engine lowers the priority of the threads that run a read and gives it back after; without that,
    its shared threads would stay low, and a write's turn on one of them too."""
    able: list[bool] = []

    def probe() -> None:
        thread = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, thread)
        try:
            os.setpriority(os.PRIO_PROCESS, thread, now + 1)
            os.setpriority(os.PRIO_PROCESS, thread, now)
            able.append(True)
        except OSError:
            able.append(False)

    prober = threading.Thread(target=probe)  # a thread of its own: left lower, it ends
    prober.start()
    prober.join()
    return able[0]
