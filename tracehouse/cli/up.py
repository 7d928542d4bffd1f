"""`tracehouse up` and `tracehouse ui`: the server's companions on one machine. The agent
samples NVML (or two simulated GPUs where there is no driver, with a notice); the UI is
Streamlit in a process of its own; `--demo` imports two generated runs first and, where torch
is installed, runs `tracehouse demo-train` in a process of its own too (so that the workload's
CUDA context and memory are its own, not `up`'s, and a slow or dead server cannot hold `up`),
bounded by DEMO_TRAIN_TIMEOUT_S."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from agent.runs.children import stop_process, with_parent
from tracehouse import config
from tracehouse.channel import SECURITY_VARIABLES, ClientSecurity
from tracehouse.cli.options import command_name
from tracehouse.security import TOKEN_BYTES, ServerSecurity, glob_escape

UI_START_TIMEOUT_S = 60.0
DEMO_TRAIN_STEPS = 30
DEMO_TRAIN_TIMEOUT_S = 300.0  # demo-train is stopped after this long
# Kept from the UI's process: clients' credentials (it gets its own) and the server's store settings.
NOT_FOR_UI = (*SECURITY_VARIABLES, config.ENV_STORE, config.ENV_STORE_PASSWORD)


def ui_command(port: int, address: str = "127.0.0.1") -> list[str]:
    import ui

    app = Path(ui.__file__).parent / "app.py"
    return [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.port", str(port), "--server.address", address, "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
        "--client.toolbarMode", "minimal",
    ]  # fmt: skip


def start_ui(
    server: str, port: int, address: str = "127.0.0.1", security: ClientSecurity | None = None
) -> subprocess.Popen[bytes]:
    """The UI in a process of its own (that stops when this one dies), once it answers its
    health check; stopped again if anything (a signal too) interrupts the wait."""
    process = subprocess.Popen(
        with_parent(ui_command(port, address)), env=ui_environment(server, security), stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + UI_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the UI exited at start (status {process.returncode}); is port {port} free?")
            try:
                url = f"http://{_reachable(address)}:{port}/_stcore/health"
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return process
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        raise RuntimeError(f"the UI did not answer on port {port} within {UI_START_TIMEOUT_S:.0f} s")
    except BaseException:
        stop_process(process)
        raise


def torch_hint() -> str:
    """The command that installs torch into the environment tracehouse runs in (its `torch` extra's
    version), as it can be pasted: a bare `pip` may be another environment's."""
    from importlib import metadata

    wanted = "torch"
    try:
        for requirement in metadata.requires("tracehouse") or []:
            spec, _, marker = requirement.partition(";")
            if spec.strip().startswith("torch") and "torch" in marker:
                wanted = spec.strip().replace(" ", "")
    except metadata.PackageNotFoundError:
        pass
    return shlex.join([sys.executable, "-m", "pip", "install", wanted])


def ui_environment(server: str, security: ClientSecurity | None) -> dict[str, str]:
    """This process's environment with the server's address and `security` as the variables
    that the app's Client reads (and none of this process's own credentials or store settings),
    and this command as the user runs it (for the hints the UI prints)."""
    inherited = {name: value for name, value in os.environ.items() if name not in NOT_FOR_UI}
    own = {config.ENV_SERVER: server, config.ENV_COMMAND: command_name()}
    return {**inherited, **own, **(security or ClientSecurity()).environment()}


def demo_train_command(address: str, steps: int = DEMO_TRAIN_STEPS) -> list[str]:
    return [sys.executable, "-m", "tracehouse.cli.main", "demo-train", "--server", address, "--steps", str(steps)]


def _reachable(address: str) -> str:
    """Where this machine reaches a server bound to `address`, as a URL host."""
    if address in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{address}]" if ":" in address else address


class Up:
    """What `tracehouse up` runs beside the server, started once the server listens."""

    def __init__(self, ui_port: int | None, demo: bool) -> None:
        from agent.daemon import Agent

        self.ui_port = ui_port
        self.demo = demo
        self.agent: Agent | None = None
        self.ui: subprocess.Popen[bytes] | None = None
        self.agent_token: str | None = None  # write, for the agent and the demo import
        self.ui_token: str | None = None  # read
        self.tls = False
        self._secrets: Path | None = None
        self.trainer: subprocess.Popen[bytes] | None = None  # demo-train, while it runs
        self.trainer_done = threading.Event()
        self._stopping = False

    def secure(self, security: ServerSecurity) -> ServerSecurity:
        """The server's settings plus what this process's agent and UI need: with tokens, a
        write token bound to this host (what the agent, the demo and demo-train write) and a read
        token of their own; with TLS, a plain-text unix socket that only this user can reach (no
        client certificate is needed there, whatever --tls-client-ca says)."""
        self.tls = security.tls is not None
        if security.tokens is None:
            return dataclasses.replace(security, local_socket=self.tls)
        self.agent_token = secrets.token_urlsafe(TOKEN_BYTES)
        self.ui_token = secrets.token_urlsafe(TOKEN_BYTES)
        own_host = [glob_escape(socket.gethostname())]
        tokens = security.tokens.adding(self.agent_token, "write", hosts=own_host).adding(self.ui_token, "read")
        return dataclasses.replace(security, tokens=tokens, local_socket=self.tls)

    def _ui_security(self) -> ClientSecurity:
        if self.ui_token is None:
            return ClientSecurity()
        return ClientSecurity(self.ui_token, token_file=self._token_file("ui.token", self.ui_token))

    def _token_file(self, name: str, token: str) -> Path:
        """`token` in a file of a folder that only this user may enter, for a child process."""
        if self._secrets is None:
            self._secrets = Path(tempfile.mkdtemp(prefix="tracehouse-up-"))  # mode 700
        token_file = self._secrets / name
        with os.fdopen(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as opened:
            opened.write(token)
        return token_file

    def start(self, address: str) -> None:
        from agent.daemon import Agent, AgentConfig, open_backend
        from agent.telemetry.gpu import BackendUnavailable

        try:
            backend = open_backend(None)
            what = "NVML"
        except BackendUnavailable as error:
            print(f"tracehouse: {error}: sampling 2 simulated GPUs instead", file=sys.stderr)
            backend = open_backend(2)
            what = "2 simulated GPUs"
        started = time.time_ns()
        own = ClientSecurity(self.agent_token)
        settings = AgentConfig(server=address, spool=config.default_spool(), security=own, host_agent=True)
        self.agent = Agent(settings, backend)
        self.agent.start()
        if self.demo:
            from tracehouse.cli.demo import load_demo

            runs = load_demo(address, socket.gethostname(), started, gpus=len(backend.indices()), security=own)
            print(f"tracehouse: imported the demo runs {', '.join(r.run_id for r in runs)}", file=sys.stderr)
            self._demo_train(address)
        lines = [f"tracehouse is up: gRPC on {address}, agent sampling {what}, store in {config.home()}"]
        reader = self._ui_security()
        if self.ui_port is not None:
            self.ui = start_ui(address, self.ui_port, security=reader)
            lines.append(f"  UI: http://127.0.0.1:{self.ui_port}")
        if self.tls:
            lines.append(
                f"  ({address} is plain text, for this user's processes only; elsewhere use --listen with --tls-ca)"
            )
        lines += [f"  {hint}" for hint in self.hints(address, reader)]
        lines.append("Ctrl-C stops it.")
        print("\n".join(lines), flush=True)

    @staticmethod
    def hints(address: str, reader: ClientSecurity) -> list[str]:
        """Commands to try, as this user can run them against this server (with a read token while it runs)."""
        flags = ["--server", address, *(["--token-file", str(reader.token_file)] if reader.token_file else [])]
        return [
            f"{command_name()} {shlex.join(['query', 'runs', *flags])}",
            f"{command_name()} {shlex.join(['query', 'series', '--metric', 'gpu.util_pct', '--from', '-5m', *flags])}",
        ]

    def _demo_train(self, address: str, timeout: float = DEMO_TRAIN_TIMEOUT_S) -> None:
        """Where torch is installed, a real workload too: `tracehouse demo-train` in a process of
        its own, with the agent's write token, started and left to run; a thread reports how it
        ended (and stops it after `timeout` seconds). The demo is a bonus: up goes on without it."""
        from tracehouse.cli.demo_train import torch_available

        if not torch_available():
            print(f"tracehouse: {torch_hint()} would add a real training run to --demo", file=sys.stderr)
            self.trainer_done.set()
            return
        token = self.agent_token
        security = (
            ClientSecurity(token, token_file=self._token_file("demo.token", token)) if token else ClientSecurity()
        )
        try:
            self.trainer = subprocess.Popen(
                with_parent(demo_train_command(address)), env=ui_environment(address, security),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
        except OSError as error:
            print(f"tracehouse: demo-train did not start: {error}", file=sys.stderr)
            self.trainer_done.set()
            return
        print("tracehouse: training the demo run in the background (tracehouse demo-train)", file=sys.stderr)
        threading.Thread(
            target=self._await_trainer, args=(self.trainer, timeout), name="demo-train", daemon=True
        ).start()

    def _await_trainer(self, trainer: subprocess.Popen[bytes], timeout: float) -> None:
        try:
            try:
                out, err = trainer.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop_process(trainer)
                print(f"tracehouse: demo-train stopped after {timeout:.0f} s", file=sys.stderr)
                return
            if self._stopping:
                return
            print(f"tracehouse: {demo_train_outcome(trainer.returncode, out, err)}", file=sys.stderr, flush=True)
        finally:
            self.trainer_done.set()

    def stop(self) -> None:
        self._stopping = True
        if self.trainer is not None:
            stop_process(self.trainer)
        if self.ui is not None:
            stop_process(self.ui)
        if self._secrets is not None:
            shutil.rmtree(self._secrets, ignore_errors=True)
        if self.agent is not None:
            print(json.dumps(self.agent.stop()), flush=True)


def demo_train_outcome(status: int, out: bytes, err: bytes) -> str:
    """One line on how `tracehouse demo-train` ended, from its status and output."""
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if isinstance(result, dict) and "run_id" in result:
        imported = result.get("import") or {}
        profile = imported.get("run_id") if isinstance(imported, dict) else None
        profile = profile or result.get("import_error", "not imported")
        return f"trained the demo run {result['run_id']} (its profile: {profile})"
    last = (err.decode("utf-8", "replace").strip().splitlines() or [f"status {status}"])[-1]
    return f"demo-train failed: {last.removeprefix('tracehouse: ')[:300]}"
