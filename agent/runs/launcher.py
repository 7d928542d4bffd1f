"""`tracehouse run`: run a command, or a matrix of them, each as a run with telemetry.

Each command is a run (source `user`): name, host, command line (values of options that look
like secrets hidden), start and end, exit status, the GPUs it was given, tags, a chosen set of
environment variables. Its processes, followed as children appear, are stored as `process`
events of the run (pid, parent, first and last seen), so that NVML's per-process readings on
the host are attributed to it and not to a neighbour on the same GPU; those still running when
the command ends are stopped. Telemetry comes from the host's agent when one runs for the
same server, else from an agent started in this process for the duration. Batches go through
a shipper with a spool of their own (`$TRACEHOUSE_HOME/spool/runs`): with the server away, the
runs wait there until the next run, training run or the host's agent sends them.

How the commands are started and how signals reach them: agent.runs.children.
The arguments and the checks made before anything starts: agent.runs.runargs; the nsys step after a
run: agent.runs.nsys_step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.runs import children
from agent.runs.matrix_model import RunSpec
from agent.runs.nsys_step import import_trace
from agent.runs.proctree import ProcessTree
from agent.runs.runargs import LaunchError, Settings, nsys_path, redacted
from agent.runs.runspool import remove_spool, replay_spools, spool_folder
from agent.shipping.batcher import Batcher
from agent.shipping.shipper import Shipper
from agent.shipping.spool import Spool
from tracehouse import __version__
from tracehouse.ids import make_run_id
from tracehouse.jobs import JOB_ENV, job_from_environment

if TYPE_CHECKING:
    from agent.daemon import Agent
    from agent.telemetry.gpu import GpuBackend

log = logging.getLogger("tracehouse.run")

EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
EXIT_INTERRUPTED = 130
KILL_AFTER_INTERRUPTS = 3
TICK_S = 0.05  # how often exits and signals are looked at
# environment variables recorded with every run, when set (more with --env)
RECORDED_ENV = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG", "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID",
)  # fmt: skip
MAX_NAME_IN_ID = 50  # of a run's name in its id: the id stays under the batch ids' 128 bytes
MAX_HOST_IN_ID = 40


# -- runs ---------------------------------------------------------------------------------------


@dataclass
class Finished:
    spec: RunSpec
    run_id: str
    status: str
    exit_code: int  # this process's exit status for it: the command's, 128+N for signal N
    seconds: float
    processes: int


@dataclass
class _Launched:
    spec: RunSpec
    run_id: str
    batcher: Batcher
    attrs: dict[str, str]
    started_ns: int
    started: float  # monotonic
    pid: int = 0
    tree: ProcessTree = field(default_factory=ProcessTree)
    status: str = ""
    exit_code: int | None = None
    terminated_at: float | None = None  # when a timeout sent SIGTERM
    report: Path | None = None
    ended_ns: int | None = None  # when its command's exit was collected

    def running(self) -> bool:
        return self.pid > 0 and self.exit_code is None


class Launcher:
    """One `tracehouse run`: telemetry, and a shipper with its spool, for every run it starts.
    Construct it inside `children.Signals` (its threads inherit the blocked signals); the
    GPUs each spec asks for are checked before anything starts."""

    def __init__(self, settings: Settings, label: str, specs: Sequence[RunSpec]) -> None:
        self.settings = settings
        self.session = f"{time.time_ns():x}.{os.getpid()}"
        self.finished: list[Finished] = []
        self.interrupted = False
        self.signal: int | None = None  # the last signal this process received
        self.shipping: dict[str, Any] = {}
        self.dropped_batches = 0
        self.terminal = children.Terminal()
        self._interrupts = 0
        self._run_ids: set[str] = set()
        self._stop = threading.Event()
        self._agent: Agent | None = None
        self._agent_lock: Any = None  # on the spool folder of the agent started here
        self.host_agent: dict[str, Any] | None = None
        backend, self.telemetry, known = self._telemetry()
        try:
            for spec in specs:
                self._check_gpus(spec, known, label)
            try:
                self._folder, self._lock = spool_folder(settings.spool_root, f"run.{self.session}", settings.server)
            except OSError as error:
                raise LaunchError(f"--spool {settings.spool_root}: {error.strerror or error}") from None
        except LaunchError:
            if backend is not None:
                backend.close()
            raise
        children.become_subreaper()
        self.spool = Spool(self._folder, 1 << 30, on_drop=self._dropped)
        self.shipper = Shipper(settings.server, self.spool, on_stored=lambda *_: None, on_dropped=self._dropped,
                               security=settings.security, call_timeout=5.0)  # fmt: skip
        self._replayer = threading.Thread(
            target=replay_spools, args=(settings.spool_root, settings.server, settings.security, self._stop),
            name="runs-replay", daemon=True,
        )  # fmt: skip
        self._replayer.start()
        if backend is not None:
            self._start_agent(backend, label)

    def _dropped(self, batch_id: str, values: int) -> None:
        self.dropped_batches += 1

    def _telemetry(self) -> tuple[GpuBackend | None, str, list[int] | None]:
        """(a backend for an agent of our own, what the runs' telemetry is, the GPUs known)."""
        from agent.daemon import open_backend
        from agent.runs.presence import running_agent
        from agent.telemetry.gpu import BackendUnavailable

        settings = self.settings
        running = running_agent(settings.server) if settings.agent == "auto" else None
        if running is not None:
            self.host_agent = running
            gpus = running.get("gpus")
            known = [int(g) for g in gpus] if isinstance(gpus, list) else None
            return None, f"host agent (pid {running.get('pid', '?')}, run {running.get('run_id', '?')})", known
        if settings.agent == "none":
            return None, "none (--agent none)", None
        try:
            backend = open_backend(settings.simulate)
        except BackendUnavailable as error:
            if settings.agent == "start":
                raise LaunchError(f"--agent start: {error} (--simulate N samples N simulated GPUs)", status=1) from None
            print(
                f"tracehouse: no GPU telemetry for this run: {error} (--simulate N samples N simulated GPUs)",
                file=sys.stderr,
            )
            return None, f"none: {error}", None
        return backend, f"started for the run: {backend.name}", backend.indices()

    @staticmethod
    def _check_gpus(spec: RunSpec, known: list[int] | None, label: str) -> None:
        missing = [g for g in spec.gpus or () if known is not None and g not in known]
        if missing:
            where = f"{label} line {spec.line}" if spec.line else "--gpus"
            have = ",".join(map(str, known or [])) or "none"
            raise LaunchError(f"{where}: GPU {missing[0]} is not on this host (GPUs: {have})")

    def _start_agent(self, backend: GpuBackend, label: str) -> None:
        from agent.daemon import Agent, AgentConfig

        settings = self.settings
        folder, self._agent_lock = spool_folder(settings.spool_root, f"agent.{self.session}", settings.server)
        config = AgentConfig(
            server=settings.server, spool=folder, interval=settings.interval, run_name=f"tracehouse run {label}"[:120],
            host=settings.host, security=settings.security, shutdown_timeout=settings.end_timeout,
        )  # fmt: skip
        self._agent = Agent(config, backend)
        self._agent.start()
        self.telemetry += f", run {self._agent.run_id}"

    def close(self) -> None:
        """Stop telemetry and ship what is pending (briefly, if the server is away); what is
        left stays in the spool (`shipping` says how much)."""
        connected = self.shipper.connected
        timeout = self.settings.end_timeout if connected else 0.5
        self._replayer.join(timeout if connected else 0.0)  # earlier runs' spools, while the server answers
        self._stop.set()
        if self._agent is not None:
            self._agent.stop(timeout if self._agent.shipper.connected else 0.5)
            self._leave(self._agent.spool.batches, self._agent.spool.folder, self._agent_lock)
        self.shipper.shutdown(timeout)
        waiting = self.spool.batches
        self._leave(waiting, self._folder, self._lock)
        self._replayer.join(0.5)
        self.terminal.close()
        self.shipping = {
            "spooled_batches": waiting,
            "dropped_batches": self.dropped_batches,
            "spool": str(self._folder),
        }

    @staticmethod
    def _leave(batches: int, folder: Path, handle: Any) -> None:
        if batches:
            if handle is not None:
                handle.close()  # the next run, or the host's agent, sends them
        else:
            remove_spool(folder, handle)

    # -- a slot: commands started together ---------------------------------------------------

    def run_slot(self, specs: Sequence[RunSpec], signals: children.Signals) -> list[Finished]:
        """Start the specs together, in one process group that has the terminal, and wait for
        all of them; returns them finished (none when an interrupt came first)."""
        while (number := signals.take()) is not None:  # before the slot: it does not start
            self._interrupted(number)
        if self.interrupted:
            return []
        group = 0
        launched = []
        for spec in specs:
            one = self._start(spec, group)
            group = group or one.pid
            launched.append(one)
        if group:
            self.terminal.give(group)
        polled = 0.0
        try:
            while any(one.running() for one in launched):
                number = signals.take(TICK_S)
                if number is not None:
                    self._signalled(number, group, launched)
                for one in launched:
                    if one.running():
                        self._reap(one, group)
                now = time.monotonic()
                if now - polled >= self.settings.poll_interval:
                    polled = now
                    self._walk(launched)
                self._enforce_timeouts(launched, now)
        finally:
            self.terminal.take_back(group)
        self._stop_leftovers(launched, group, signals)
        done = [self._finish(one, signals) for one in launched]
        self.finished.extend(done)
        while (number := signals.take()) is not None:  # during the export or the import
            self._interrupted(number)
        return done

    def _walk(self, launched: Sequence[_Launched]) -> None:
        """Walk the runs' trees; orphans of theirs this process adopted join the first run of
        the slot still running (the only one, unless the slot is collocated)."""
        known = {one.pid for one in launched} | {pid for one in launched for pid in one.tree.processes}
        adopters = [one for one in launched if one.running()] or list(launched)
        for pid in children.adopted(known):
            adopters[0].tree.add_root(pid)
        for one in launched:
            one.tree.poll()

    def _new_run_id(self, name: str, started_ns: int) -> str:
        run_id = base = make_run_id(name[:MAX_NAME_IN_ID], self.settings.host[:MAX_HOST_IN_ID], started_ns)
        number = 1
        while run_id in self._run_ids:
            number += 1
            run_id = f"{base}.{number}"
        self._run_ids.add(run_id)
        return run_id

    def _start(self, spec: RunSpec, group: int) -> _Launched:
        settings = self.settings
        started_ns = time.time_ns()
        run_id = self._new_run_id(spec.name, started_ns)
        env = {**os.environ, **spec.env, "TRACEHOUSE_PARENT_RUN": run_id}
        if settings.server_given:
            env["TRACEHOUSE_SERVER"] = settings.server
        if spec.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's indices are then NVML's
        attrs = self._start_attrs(spec, env)
        batcher = Batcher(run_id, settings.host, self.shipper.submit, max_age=3600.0)
        one = _Launched(spec, run_id, batcher, attrs, started_ns, time.monotonic())
        argv = list(spec.command)
        if spec.nsys:
            settings.nsys_dir.mkdir(parents=True, exist_ok=True)
            one.report = settings.nsys_dir / re.sub(r"[^A-Za-z0-9_-]", "_", run_id)  # nsys adds .nsys-rep
            argv = [nsys_path(), "profile", f"--output={one.report}", "--force-overwrite=true", *spec.nsys_args, *argv]
        try:
            one.pid = children.spawn(argv, env, group)
        except FileNotFoundError:
            one.status, one.exit_code = f"failed: command not found: {argv[0][:200]}", EXIT_NOT_FOUND
        except OSError as error:
            one.status, one.exit_code = f"failed: cannot run {argv[0][:200]}: {error.strerror}", EXIT_CANNOT_EXECUTE
        if one.pid:
            attrs["pid"] = str(one.pid)
            one.tree.add_root(one.pid)
        self._describe(one, None)
        batcher.flush()  # the run is on the server (or in the spool) from its first moment
        log.debug("run %s started: %s", run_id, attrs["command"][:200])
        return one

    def _start_attrs(self, spec: RunSpec, env: Mapping[str, str]) -> dict[str, str]:
        attrs = {
            "command": shlex.join(redacted(spec.command))[:4096],
            "cwd": os.getcwd()[:1024],
            "launcher": "tracehouse run",
            "tracehouse": __version__,
            "telemetry": self.telemetry[:1024],
        }
        if spec.gpus:
            attrs["gpus"] = ",".join(map(str, spec.gpus))
        membership = job_from_environment(env)
        if membership is not None and env.get(JOB_ENV):  # named by --job; not a job the shell it runs in is in
            attrs.update(membership.attrs())
        for name in (*RECORDED_ENV, *self.settings.record_env):
            if env.get(name):
                attrs[f"env.{name}"] = env[name][:1024]
        if spec.line:
            attrs.update(experiment=spec.experiment[:1024], repetition=str(spec.repetition), matrix_line=str(spec.line))
        if spec.nsys:
            attrs["nsys.args"] = shlex.join(redacted(spec.nsys_args))[:1024]
        return attrs

    def _interrupted(self, number: int) -> None:
        self.interrupted = True
        self.signal = number
        self._interrupts += 1
        log.debug("%s: the matrix stops after the runs in progress", signal.Signals(number).name)

    def _signalled(self, number: int, group: int, launched: Sequence[_Launched]) -> None:
        self._interrupted(number)
        if self._interrupts >= KILL_AFTER_INTERRUPTS:
            print(f"tracehouse: interrupted {self._interrupts} times: killing the run's processes", file=sys.stderr)
            children.signal_group(group, signal.SIGKILL)
            for one in launched:
                one.tree.signal(signal.SIGKILL)
            return
        if group and children.signal_group(group, number):
            print(f"tracehouse: {signal.Signals(number).name} passed on to the command", file=sys.stderr)

    def _reap(self, one: _Launched, group: int) -> None:
        code = children.reap(one.pid, self.terminal, group)
        if code is None:
            return
        one.ended_ns = time.time_ns()
        status_text, one.exit_code = children.status_of(code)
        if one.terminated_at is not None:
            status_text = f"failed: timeout after {one.spec.timeout:g} s ({status_text})"
        elif one.exit_code == EXIT_INTERRUPTED:  # Ctrl-C reached the command straight from the terminal
            self._interrupted(signal.SIGINT)
        one.status = status_text

    def _enforce_timeouts(self, launched: Sequence[_Launched], now: float) -> None:
        for one in launched:
            timeout = one.spec.timeout
            if one.running() and timeout is not None and one.terminated_at is None and now - one.started >= timeout:
                print(f"tracehouse: {one.spec.name}: past its timeout of {timeout:g} s: SIGTERM", file=sys.stderr)
                one.terminated_at = now
                one.tree.poll()
                one.tree.signal(signal.SIGTERM)
            elif (
                one.running() and one.terminated_at is not None and now - one.terminated_at >= self.settings.kill_after
            ):
                one.tree.signal(signal.SIGKILL)

    def _stop_leftovers(self, launched: Sequence[_Launched], group: int, signals: children.Signals) -> None:
        """Processes of the runs still running once their commands ended (workers, something
        started in the background, what a timeout left): SIGTERM, then SIGKILL after
        kill_after seconds. A run's processes never outlive it, nor share the GPU with the
        next run of a matrix. Members of the group the walks never saw get the same."""
        self._walk(launched)
        left = sorted({pid for one in launched for pid in one.tree.alive()})
        if group:
            children.signal_group(group, signal.SIGTERM)
        if not left:
            return
        print(f"tracehouse: {len(left)} processes of the run still running after it ended: stopping them"
              f" ({', '.join(map(str, left[:10]))})", file=sys.stderr)  # fmt: skip
        for one in launched:
            one.tree.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.kill_after
        while time.monotonic() < deadline:
            number = signals.take(self.settings.poll_interval / 5)
            if number is not None:
                self._interrupted(number)
                break
            self._walk(launched)
            if not any(one.tree.alive() for one in launched):
                return
        for one in launched:
            one.tree.signal(signal.SIGKILL)
        if group:
            children.signal_group(group, signal.SIGKILL)

    def _finish(self, one: _Launched, signals: children.Signals) -> Finished:
        end_ns = one.ended_ns or time.time_ns()
        one.tree.close([one.pid] if one.pid else [])
        processes = sorted(one.tree.processes.values(), key=lambda p: (p.first_ns, p.pid))
        if processes:
            one.batcher.add_events(
                "process",
                [p.first_ns for p in processes],
                [max(p.first_ns, p.last_ns) for p in processes],
                [p.name or f"pid {p.pid}" for p in processes],
                extras=[{"ppid": str(p.ppid), **({"root": "true"} if p.pid == one.pid else {})} for p in processes],
                pid=[p.pid for p in processes],
            )
        one.attrs["processes"] = str(len(processes))
        if one.report is not None and one.pid:
            import_trace(one.report, one.attrs, one.run_id, self.settings.host, self.shipper.submit,
                         lambda pid: self._wait_for(pid, signals))  # fmt: skip
        self._describe(one, end_ns)
        one.batcher.flush()
        seconds = (end_ns - one.started_ns) / 1e9
        code = one.exit_code if one.exit_code is not None else 1
        return Finished(one.spec, one.run_id, one.status, code, round(seconds, 3), len(processes))

    def _describe(self, one: _Launched, end_ns: int | None) -> None:
        attrs = dict(one.attrs)
        if end_ns is not None or one.status:
            attrs["status"] = one.status
            if one.exit_code is not None:
                attrs["exit_code"] = str(one.exit_code)
        else:
            attrs["status"] = "running"
        if one.status and end_ns is None:
            end_ns = time.time_ns()  # it never started
        one.batcher.describe_run(
            run_id=one.run_id, name=one.spec.name, host=self.settings.host, source="user", start=one.started_ns,
            end=end_ns, tags=dict(one.spec.tags), attrs=attrs,
        )  # fmt: skip

    # -- Nsight Systems: agent.runs.nsys_step --------------------------------------------------

    def _wait_for(self, pid: int, signals: children.Signals) -> int:
        """Wait for a helper (`nsys export`, its own group); signals are passed on to it."""
        while True:
            number = signals.take(TICK_S)
            if number is not None:
                self._interrupted(number)
                children.signal_group(pid, number)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)


@contextlib.contextmanager
def launching(settings: Settings, label: str, specs: Sequence[RunSpec]) -> Iterator[Launcher]:
    """A Launcher, closed at the end. Enter `children.Signals` first, before any thread
    starts (grpc starts some), so that no thread takes a signal meant for the commands."""
    launcher = Launcher(settings, label, specs)
    try:
        yield launcher
    finally:
        launcher.close()
