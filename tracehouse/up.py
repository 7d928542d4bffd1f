"""`tracehouse up` and `tracehouse ui`: the server's companions on one machine. The agent
samples NVML (or two simulated GPUs where there is no driver, with a notice); the UI is
Streamlit in a process of its own; `--demo` imports two generated runs first."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tracehouse import config

UI_START_TIMEOUT_S = 60.0


def ui_command(port: int, address: str = "127.0.0.1") -> list[str]:
    import ui

    app = Path(ui.__file__).parent / "app.py"
    return [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.port", str(port), "--server.address", address, "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
        "--client.toolbarMode", "minimal",
    ]  # fmt: skip


def start_ui(server: str, port: int, address: str = "127.0.0.1") -> subprocess.Popen[bytes]:
    """The UI in a process of its own, once it answers its health check."""
    environment = {**os.environ, config.ENV_SERVER: server}  # the app's Client reads it
    process = subprocess.Popen(ui_command(port, address), env=environment, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + UI_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the UI exited at start (status {process.returncode}); is port {port} free?")
        try:
            with urllib.request.urlopen(f"http://{_reachable(address)}:{port}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    return process
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    stop_process(process)
    raise RuntimeError(f"the UI did not answer on port {port} within {UI_START_TIMEOUT_S:.0f} s")


def _reachable(address: str) -> str:
    """Where this machine reaches a server bound to `address`, as a URL host."""
    if address in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{address}]" if ":" in address else address


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Up:
    """What `tracehouse up` runs beside the server, started once the server listens."""

    def __init__(self, ui_port: int | None, demo: bool) -> None:
        from agent.daemon import Agent

        self.ui_port = ui_port
        self.demo = demo
        self.agent: Agent | None = None
        self.ui: subprocess.Popen[bytes] | None = None

    def start(self, address: str) -> None:
        from agent.daemon import Agent, AgentConfig, open_backend
        from agent.gpu import BackendUnavailable

        try:
            backend = open_backend(None)
            what = "NVML"
        except BackendUnavailable as error:
            print(f"tracehouse: {error}\ntracehouse: sampling 2 simulated GPUs instead", file=sys.stderr)
            backend = open_backend(2)
            what = "2 simulated GPUs"
        started = time.time_ns()
        self.agent = Agent(AgentConfig(server=address, spool=config.default_spool()), backend)
        self.agent.start()
        if self.demo:
            from tracehouse.demo import load_demo

            runs = load_demo(address, socket.gethostname(), started, gpus=len(backend.indices()))
            print(f"tracehouse: imported the demo runs {', '.join(r.run_id for r in runs)}", file=sys.stderr)
        lines = [f"tracehouse is up: gRPC on {address}, agent sampling {what}, store in {config.home()}"]
        if self.ui_port is not None:
            self.ui = start_ui(address, self.ui_port)
            lines.append(f"  UI: http://127.0.0.1:{self.ui_port}")
        lines += [
            f"  tracehouse query runs --server {address}",
            f"  tracehouse query series --metric gpu.util_pct --from -5m --server {address}",
            "Ctrl-C stops it.",
        ]
        print("\n".join(lines), flush=True)

    def stop(self) -> None:
        if self.ui is not None:
            stop_process(self.ui)
        if self.agent is not None:
            print(json.dumps(self.agent.stop()), flush=True)
