"""What the benchmarks of `tracehouse bench ...` share: the stamp their JSON starts with, timing,
a `tracehouse serve` child process, the environment of their child processes, and watching a
child's memory. Each benchmark measures a capability against a baseline run in the same
process on the same data, printed as JSON. Ratios hold on noisy machines; absolute times don't."""

from __future__ import annotations

import contextlib
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from agent.runs.children import stop_process, with_parent
from tracehouse import config


def _stamp(bench: str, *packages: str) -> dict[str, Any]:
    """What every benchmark's JSON starts with: which one, when, and on what."""
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    return {
        "bench": bench,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine | {package: version(package) for package in packages},
    }


def _timed(function: Callable[[], None]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def _each(concurrency: int, work: Callable[[Any], None], items: Sequence[Any]) -> None:
    if concurrency == 1:
        for item in items:
            work(item)
        return
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in pool.map(work, items):
            pass


def _watch_rss(pid: int) -> list[int]:
    """Resident memory of a process, sampled every 20 ms until it ends (the kernel's own peak
    counter is no use here: a child inherits it from the parent it was forked from)."""
    import psutil

    seen = [0]

    def sample() -> None:
        try:
            process = psutil.Process(pid)
            while process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                seen.append(process.memory_info().rss)
                time.sleep(0.02)
        except psutil.Error:
            pass

    threading.Thread(target=sample, daemon=True).start()
    return seen


def _child_environment(folder: str) -> dict[str, str]:
    """This environment for a child process of a benchmark, less the user's tracehouse settings
    (store, password, server, credentials), with its home in the benchmark's `folder`."""
    mine = {name: value for name, value in os.environ.items() if not name.startswith("TRACEHOUSE_")}
    return mine | {config.ENV_HOME: folder, "PYTHONUNBUFFERED": "1"}


PACKAGES = ("agent", "ingest", "query", "store", "tracehouse")  # what a tracehouse process imports


def bytecode_cached() -> None:
    """The packages' bytecode written to their caches, as a package installed from a wheel has it and as
    Python writes it at a first run: a benchmark's child processes then start as a user's do from the
    second run on, even where PYTHONDONTWRITEBYTECODE is set (compiling them costs an importer 0.05-0.15 s
    of CPU a start)."""
    import compileall
    import importlib.util

    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(folder, quiet=1)


def start_serve(folder: str, listen: str, *options: str) -> Any:
    """`tracehouse serve` as a child process on an embedded store in `folder`, started (not yet listening)."""
    import subprocess
    import sys

    return subprocess.Popen(
        with_parent([sys.executable, "-m", "tracehouse.cli.main", "serve", "--listen", listen,
                     "--store", f"chdb://{folder}/store", *options]),
        env=_child_environment(folder), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@contextlib.contextmanager
def serving(folder: str, *options: str) -> Iterator[tuple[str, Any]]:
    """`tracehouse serve` as a child process on an embedded store in `folder`: its address and process."""
    server = start_serve(folder, "127.0.0.1:0", *options)
    try:
        yield _listening(server), server
    finally:
        stop_process(server, 60.0)


def _listening(server: Any) -> str:
    import re

    for line in server.stderr:
        found = re.search(r"listening on ([\d.]+:\d+)", line)
        if found:
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            return found.group(1)
    raise RuntimeError("tracehouse serve did not start")
