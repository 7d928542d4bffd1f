"""Children stop with the command that started them: told to stop (SIGTERM, SIGINT, SIGHUP),
the command stops them first; killed without a word (kill -9), they notice and stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

UI_START_S = 90.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def port_free(port: int) -> bool:
    """Nothing listens on it (a connection left in TIME_WAIT does not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as health:
            return health.status == 200
    except OSError:
        return False


@pytest.fixture
def processes() -> Iterator[list[psutil.Process]]:
    """Processes a test started, directly or not: killed at the end whatever happened."""
    started: list[psutil.Process] = []
    yield started
    for process in started:
        try:
            for child in process.children(recursive=True):
                child.kill()
            process.kill()
        except psutil.NoSuchProcess:
            pass


def start_ui(processes: list[psutil.Process]) -> tuple[subprocess.Popen[bytes], psutil.Process, int]:
    """`tracehouse ui` on a free port, once Streamlit answers: it, its Streamlit child, the port."""
    port = free_port()
    ui = subprocess.Popen(
        [sys.executable, "-m", "tracehouse.cli.main", "ui", "--port", str(port), "--server", "127.0.0.1:1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    processes.append(psutil.Process(ui.pid))
    assert until(lambda: answers(port) or ui.poll() is not None, UI_START_S) and ui.poll() is None
    (streamlit,) = psutil.Process(ui.pid).children()
    processes.append(streamlit)
    assert "streamlit" in " ".join(streamlit.cmdline())
    return ui, streamlit, port


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_ui_told_to_stop_stops_streamlit_first(number: int, processes: list[psutil.Process]) -> None:
    ui, streamlit, port = start_ui(processes)
    ui.send_signal(number)
    assert ui.wait(timeout=30) == 0
    assert gone(streamlit.pid), "Streamlit is stopped before `tracehouse ui` exits"
    assert port_free(port)


def test_streamlit_stops_when_ui_is_killed(processes: list[psutil.Process]) -> None:
    ui, streamlit, port = start_ui(processes)
    ui.kill()
    ui.wait(timeout=10)
    assert until(lambda: gone(streamlit.pid), 10.0), "Streamlit noticed its parent's death"
    assert until(lambda: port_free(port), 5.0)


def _parent_of_a_sleeper(argv: list[str]) -> subprocess.Popen[str]:
    """A Python process that starts `argv` (through with_parent) and prints its pid."""
    code = (
        "import subprocess, sys, time; from agent.runs.children import with_parent; "
        f"child = subprocess.Popen(with_parent({argv!r})); print(child.pid, flush=True); time.sleep(60)"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_child_started_with_parent_stops_when_its_parent_is_killed(processes: list[psutil.Process]) -> None:
    parent = _parent_of_a_sleeper(["sleep", "60"])
    processes.append(psutil.Process(parent.pid))
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    processes.append(child)
    assert until(lambda: child.name() == "sleep", 10.0), "with_parent executes the program itself, in the same pid"
    parent.kill()
    parent.wait(timeout=10)
    assert until(lambda: gone(child.pid), 5.0)


def test_a_child_whose_parent_died_before_it_started_does_not_run() -> None:
    """The window between fork and prctl: the child checks that its parent is still the one that started it."""
    from agent.runs.children import with_parent

    argv = with_parent(["sh", "-c", "echo ran"])
    argv[argv.index(str(os.getpid()))] = "1"  # as if its parent had died and init had adopted it
    finished = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert finished.returncode == 128 + signal.SIGTERM and finished.stdout == ""


def test_a_missing_program_says_so() -> None:
    from agent.runs.children import with_parent

    finished = subprocess.run(with_parent(["no-such-program-here"]), capture_output=True, text=True, timeout=30)
    assert finished.returncode == 127
    assert "cannot run no-such-program-here" in finished.stderr and "Traceback" not in finished.stderr


def test_ups_ui_stops_when_up_is_killed(tmp_path: Path, processes: list[psutil.Process]) -> None:
    ui_port = free_port()
    env = {**os.environ, "TRACEHOUSE_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    up = subprocess.Popen(
        [sys.executable, "-m", "tracehouse.cli.main", "up", "--listen", f"127.0.0.1:{free_port()}",
         "--ui-port", str(ui_port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    processes.append(psutil.Process(up.pid))
    assert up.stdout is not None
    assert up.stdout.readline().startswith("tracehouse is up"), "up started"
    (streamlit,) = [c for c in psutil.Process(up.pid).children() if "streamlit" in " ".join(c.cmdline())]
    processes.append(streamlit)
    up.kill()
    up.wait(timeout=10)
    assert until(lambda: gone(streamlit.pid), 10.0), "the UI noticed that up died"
    assert until(lambda: port_free(ui_port), 5.0)
