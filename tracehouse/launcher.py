"""`tracehouse run`: run a command, or a matrix of them, each as a run with telemetry.

Each command is a run (source `user`): name, host, command line, start and end, exit status,
the GPUs it was given, tags, a chosen set of environment variables. Its processes, followed
as children appear, are stored as `process` events of the run (pid, first and last seen), so
that NVML's per-process readings on the host are attributed to it and not to a neighbour on
the same GPU. Telemetry comes from the host's agent when one runs for the same server, else
from an agent started in this process for the duration. Batches go through a shipper with
a spool of their own (`$TRACEHOUSE_HOME/spool/runs`): with the server away, the runs wait
there until the next run, training run or the host's agent sends them.

Signals: the command is in this process's group, so Ctrl-C at a terminal reaches it
directly; SIGINT, SIGTERM and SIGHUP sent to this process alone (kill, a scheduler) are
forwarded to it. The third interrupt kills its processes. Either way the run is closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.batcher import Batcher
from agent.proctree import ProcessTree
from agent.runspool import remove_spool, replay_spools, spool_folder
from agent.shipper import Shipper
from agent.spool import Spool
from tracehouse import __version__
from tracehouse.ids import make_run_id
from tracehouse.matrix import RunSpec

if TYPE_CHECKING:
    from agent.daemon import Agent
    from tracehouse.channel import ClientSecurity

log = logging.getLogger("tracehouse.run")

EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KILL_AFTER_INTERRUPTS = 3
TICK_S = 0.05  # how often exits and signals are looked at
# environment variables recorded with every run, when set (more with --env)
RECORDED_ENV = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG", "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID",
)  # fmt: skip
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|(^|_)KEY($|_)|AUTH", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class LaunchError(Exception):
    """Nothing was started: the message says why; `status` is the exit status to give."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Settings:
    server: str
    host: str
    spool_root: Path
    nsys_dir: Path
    security: ClientSecurity | None = None
    server_given: bool = False  # --server: the command's own tracehouse.run() is sent there too
    agent: str = "auto"  # auto: the host's agent if one runs, else one of our own; start; none
    simulate: int | None = None
    interval: float = 0.1
    record_env: tuple[str, ...] = ()
    poll_interval: float = 0.5  # how often the process trees are walked
    end_timeout: float = 5.0  # time to ship what is pending at the end while the server answers
    kill_after: float = 10.0  # after a timeout's SIGTERM, SIGKILL


def check_env_names(names: Sequence[str]) -> tuple[str, ...]:
    """Names for --env: valid, and none that looks like it holds a secret."""
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise LaunchError(f"--env {name[:64]!r}: not an environment variable name")
        if _SECRET_NAME.search(name):
            raise LaunchError(f"--env {name}: looks like it holds a secret; tracehouse does not record those")
    return tuple(names)


def nsys_path() -> str:
    found = shutil.which("nsys")
    if found is None:
        raise LaunchError(
            "--nsys: no `nsys` on PATH; install Nsight Systems (https://developer.nvidia.com/nsight-systems) "
            "or add the folder holding `nsys` to PATH"
        )
    return found


def gpu_list(text: str) -> tuple[int, ...]:
    """`0,1` → (0, 1); refuses anything else, naming the option."""
    gpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) > 4095:
            raise LaunchError(f"--gpus {text!r}: {part!r} is not a GPU index (0..4095), e.g. --gpus 0,1")
        if int(part) not in gpus:
            gpus.append(int(part))
    return tuple(gpus)


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

    def running(self) -> bool:
        return self.pid > 0 and self.exit_code is None


class _Signals:
    """Block the forwarded signals in every thread (threads started later inherit the mask),
    and take them one by one with sigtimedwait in the main thread, with who sent them."""

    def __enter__(self) -> _Signals:
        self._before = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        return self

    def wait(self, timeout: float) -> Any:
        return signal.sigtimedwait(FORWARDED, timeout)

    def __exit__(self, *exc: object) -> None:
        while signal.sigtimedwait(FORWARDED, 0) is not None:
            pass  # taken now, so that none is delivered once unblocked
        signal.pthread_sigmask(signal.SIG_SETMASK, self._before)


def _from_terminal(info: Any) -> bool:
    """A signal the kernel sent (the terminal's Ctrl-C): the command, in our process group,
    received it too. One from kill() or sigqueue() has si_code <= 0."""
    return int(info.si_code) > 0


def _spawn(argv: Sequence[str], env: Mapping[str, str], stdout_to_stderr: bool = False) -> int:
    """Start argv with every signal unblocked and SIGPIPE back to its default, as a shell would."""
    actions = [(os.POSIX_SPAWN_DUP2, 2, 1)] if stdout_to_stderr else []
    return os.posix_spawnp(
        argv[0], list(argv), dict(env), file_actions=actions, setsigmask=(), setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
    )


def _status_of(code: int) -> tuple[str, int]:
    """(status, exit status) from os.waitstatus_to_exitcode's answer."""
    if code == 0:
        return "ok", 0
    if code > 0:
        return f"failed: exit {code}", code
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed: {name}", 128 - code


class Launcher:
    """One `tracehouse run`: telemetry, a shipper and its spool for every run it starts."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.session = f"{time.time_ns():x}.{os.getpid()}"
        self.finished: list[Finished] = []
        self.interrupted = False
        self._interrupts = 0
        self._run_ids: set[str] = set()
        self._stop = threading.Event()
        self._agent: Agent | None = None
        self._agent_spool: tuple[Path, Any] | None = None
        self.telemetry = "none"
        self.known_gpus: list[int] | None = None
        self.shipping: dict[str, Any] = {}

    # -- the session: shipper, telemetry ----------------------------------------------------

    def open(self, label: str) -> None:
        settings = self.settings
        self._folder, self._lock = spool_folder(settings.spool_root, f"run.{self.session}", settings.server)
        self.spool = Spool(self._folder, 1 << 30, on_drop=self._dropped)
        self.dropped_batches = 0
        self.shipper = Shipper(settings.server, self.spool, on_stored=lambda *_: None, on_dropped=self._dropped,
                               security=settings.security, call_timeout=5.0)  # fmt: skip
        self._replayer = threading.Thread(
            target=replay_spools, args=(settings.spool_root, settings.server, settings.security, self._stop),
            name="runs-replay", daemon=True,
        )  # fmt: skip
        self._replayer.start()
        self._start_telemetry(label)

    def _dropped(self, batch_id: str, values: int) -> None:
        self.dropped_batches += 1

    def _start_telemetry(self, label: str) -> None:
        from agent.daemon import Agent, AgentConfig, open_backend
        from agent.gpu import BackendUnavailable
        from agent.presence import running_agent

        settings = self.settings
        running = running_agent(settings.server) if settings.agent == "auto" else None
        if running is not None:
            self.telemetry = f"host agent (pid {running.get('pid', '?')}, run {running.get('run_id', '?')})"
            gpus = running.get("gpus")
            self.known_gpus = [int(g) for g in gpus] if isinstance(gpus, list) else None
            return
        if settings.agent == "none":
            self.telemetry = "none (--agent none)"
            return
        try:
            backend = open_backend(settings.simulate)
        except BackendUnavailable as error:
            if settings.agent == "start":
                raise LaunchError(f"--agent start: {error}", status=1) from None
            self.telemetry = f"none: {error}"
            print(f"tracehouse: no GPU telemetry for this run: {error}", file=sys.stderr)
            return
        self.known_gpus = backend.indices()
        folder, handle = spool_folder(settings.spool_root, f"agent.{self.session}", settings.server)
        self._agent_spool = (folder, handle)
        config = AgentConfig(
            server=settings.server, spool=folder, interval=settings.interval, run_name=f"tracehouse run {label}"[:120],
            host=settings.host, security=settings.security, shutdown_timeout=settings.end_timeout,
        )  # fmt: skip
        self._agent = Agent(config, backend)
        self._agent.start()
        self.telemetry = f"started for the run: {backend.name}, run {self._agent.run_id}"

    def check_gpus(self, gpus: Sequence[int] | None, where: str) -> None:
        if gpus and self.known_gpus is not None:
            missing = [g for g in gpus if g not in self.known_gpus]
            if missing:
                have = ",".join(map(str, self.known_gpus)) or "none"
                raise LaunchError(f"{where}: GPU {missing[0]} is not on this host (GPUs: {have})")

    def close(self) -> dict[str, Any]:
        """Stop telemetry and ship what is pending (briefly, if the server is away); what is
        left stays in the spool. Returns what happened to the batches."""
        connected = self.shipper.connected
        timeout = self.settings.end_timeout if connected else 0.5
        self._replayer.join(timeout if connected else 0.0)  # earlier runs' spools, while the server answers
        self._stop.set()
        if self._agent is not None:
            self._agent.stop(timeout if self._agent.shipper.connected else 0.5)
            folder, handle = self._agent_spool or (None, None)
            if folder is not None:
                self._leave(Spool(folder, 1 << 40, on_drop=lambda *_: None).batches, folder, handle)
        self.shipper.shutdown(timeout)
        waiting = self.spool.batches
        self._leave(waiting, self._folder, self._lock)
        self._replayer.join(0.5)
        return {"spooled_batches": waiting, "dropped_batches": self.dropped_batches, "spool": str(self._folder)}

    @staticmethod
    def _leave(batches: int, folder: Path, handle: Any) -> None:
        if batches:
            if handle is not None:
                handle.close()  # the next run, or the host's agent, sends them
        else:
            remove_spool(folder, handle)

    # -- runs ---------------------------------------------------------------------------------

    def run_slot(self, specs: Sequence[RunSpec], signals: _Signals) -> list[Finished]:
        """Start the specs together and wait for all of them; returns them finished."""
        launched = [self._start(spec) for spec in specs]
        polled = 0.0
        while any(one.running() for one in launched):
            info = signals.wait(TICK_S)
            if info is not None:
                self._signalled(info, launched)
            for one in launched:
                if one.running():
                    self._reap(one)
            now = time.monotonic()
            if now - polled >= self.settings.poll_interval:
                polled = now
                for one in launched:
                    if one.running():
                        one.tree.poll()
            self._enforce_timeouts(launched, now)
        done = [self._finish(one, signals) for one in launched]
        self.finished.extend(done)
        return done

    def _new_run_id(self, name: str, started_ns: int) -> str:
        run_id = base = make_run_id(name, self.settings.host, started_ns)
        number = 1
        while run_id in self._run_ids:
            number += 1
            run_id = f"{base}.{number}"
        self._run_ids.add(run_id)
        return run_id

    def _start(self, spec: RunSpec) -> _Launched:
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
            one.pid = _spawn(argv, env)
        except FileNotFoundError:
            one.status, one.exit_code = f"failed: command not found: {argv[0][:200]}", EXIT_NOT_FOUND
        except OSError as error:
            one.status, one.exit_code = f"failed: cannot run {argv[0][:200]}: {error.strerror}", EXIT_CANNOT_EXECUTE
        if one.pid:
            attrs["pid"] = str(one.pid)
            one.tree.add_root(one.pid)
        self._describe(one, None)
        batcher.flush()  # the run is on the server (or in the spool) from its first moment
        log.debug("run %s started: %s", run_id, shlex.join(spec.command)[:200])
        return one

    def _start_attrs(self, spec: RunSpec, env: Mapping[str, str]) -> dict[str, str]:
        attrs = {
            "command": shlex.join(spec.command)[:4096],
            "cwd": os.getcwd()[:1024],
            "launcher": "tracehouse run",
            "tracehouse": __version__,
            "telemetry": self.telemetry[:1024],
        }
        if spec.gpus:
            attrs["gpus"] = ",".join(map(str, spec.gpus))
        for name in (*RECORDED_ENV, *self.settings.record_env):
            if env.get(name):
                attrs[f"env.{name}"] = env[name][:1024]
        if spec.line:
            attrs.update(experiment=spec.experiment[:1024], repetition=str(spec.repetition), matrix_line=str(spec.line))
        if spec.nsys:
            attrs["nsys.args"] = shlex.join(spec.nsys_args)[:1024]
        return attrs

    def _signalled(self, info: Any, launched: Sequence[_Launched]) -> None:
        number = int(info.si_signo)
        self.interrupted = True
        self._interrupts += 1
        running = [one for one in launched if one.running()]
        if self._interrupts >= KILL_AFTER_INTERRUPTS:
            print(f"tracehouse: interrupted {self._interrupts} times: killing the run's processes", file=sys.stderr)
            for one in running:
                self._kill_tree(one, signal.SIGKILL)
            return
        if _from_terminal(info):
            return
        for one in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(one.pid, number)
        print(f"tracehouse: {signal.Signals(number).name} passed on to the command", file=sys.stderr)

    def _kill_tree(self, one: _Launched, number: int) -> None:
        for pid in [one.pid, *one.tree.alive()]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, number)

    def _reap(self, one: _Launched) -> None:
        pid, status = os.waitpid(one.pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            status_text, one.exit_code = _status_of(code)
            if one.terminated_at is not None:
                status_text = f"failed: timeout after {one.spec.timeout:g} s ({status_text})"
            one.status = status_text

    def _enforce_timeouts(self, launched: Sequence[_Launched], now: float) -> None:
        for one in launched:
            timeout = one.spec.timeout
            if not one.running() or timeout is None:
                continue
            if one.terminated_at is None and now - one.started >= timeout:
                print(f"tracehouse: {one.spec.name}: past its timeout of {timeout:g} s: SIGTERM", file=sys.stderr)
                one.terminated_at = now
                with contextlib.suppress(ProcessLookupError):
                    os.kill(one.pid, signal.SIGTERM)
            elif one.terminated_at is not None and now - one.terminated_at >= self.settings.kill_after:
                self._kill_tree(one, signal.SIGKILL)

    def _finish(self, one: _Launched, signals: _Signals) -> Finished:
        end_ns = time.time_ns()
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
            self._import_trace(one, signals)
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

    # -- Nsight Systems -------------------------------------------------------------------------

    def _import_trace(self, one: _Launched, signals: _Signals) -> None:
        from agent.importer import import_export
        from agent.tracefile import TraceFileError
        from agent.watch import ShipperSink

        assert one.report is not None
        written = [Path(f"{one.report}{suffix}") for suffix in (".nsys-rep", ".qdrep")]
        report = next((path for path in written if path.exists()), None)
        if report is None:
            one.attrs["trace"] = f"none: nsys wrote no report at {one.report}.nsys-rep"
            return
        one.attrs["nsys.report"] = str(report)
        export = Path(f"{one.report}.sqlite")
        argv = [nsys_path(), "export", "--type=sqlite", f"--output={export}", "--force-overwrite=true", str(report)]
        code = self._wait_for(_spawn(argv, os.environ, stdout_to_stderr=True), signals)
        if code != 0 or not export.exists():
            one.attrs["trace"] = f"not imported: `nsys export` ended with {_status_of(code)[0]}"
            return
        try:
            result = import_export(export, ShipperSink(self.shipper.submit), host=self.settings.host,
                                   into_run=one.run_id)  # fmt: skip
        except TraceFileError as error:
            one.attrs["trace"] = f"not imported: {error}"[:1024]
            return
        one.attrs["trace"] = "nsys"
        one.attrs["nsys.export"] = str(export)
        one.attrs.update({f"trace.{k}": v for k, v in result.attrs.items() if k not in ("command", "file")})

    def _wait_for(self, pid: int, signals: _Signals) -> int:
        while True:
            info = signals.wait(TICK_S)
            if info is not None and not _from_terminal(info):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, int(info.si_signo))
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)


@contextlib.contextmanager
def launching(settings: Settings, label: str) -> Iterator[tuple[Launcher, _Signals]]:
    """A Launcher, open, with the forwarded signals blocked until it is closed."""
    with _Signals() as signals:
        launcher = Launcher(settings)
        launcher.open(label)
        try:
            yield launcher, signals
        finally:
            launcher.shipping = launcher.close()


def single_spec(command: Sequence[str], name: str, tags: Mapping[str, str], gpus: tuple[int, ...] | None,
                nsys: bool, nsys_args: Sequence[str]) -> RunSpec:  # fmt: skip
    """The RunSpec of `tracehouse run -- COMMAND`."""
    return RunSpec(
        name=name or os.path.basename(command[0]) or "run", command=tuple(command), experiment="", params={},
        repetition=1, tags=dict(tags), env={}, gpus=gpus, nsys=nsys, nsys_args=tuple(nsys_args), timeout=None, line=0,
    )  # fmt: skip


def run_one(settings: Settings, spec: RunSpec) -> int:
    """Run one command as a run; returns its exit status (128+N when killed by signal N)."""
    with launching(settings, spec.name) as (launcher, signals):
        launcher.check_gpus(spec.gpus, "--gpus")
        finished = launcher.run_slot([spec], signals)[0]
    _say_finished(finished, launcher)
    _say_shipping(launcher)
    return finished.exit_code


def run_matrix(settings: Settings, slots: Sequence[Sequence[RunSpec]], label: str, output_format: str) -> int:
    """Run the slots one after another (the specs of a slot together); a failed run is
    recorded and the matrix goes on; an interrupt stops it after the current slot. Prints
    the summary table; returns 0 when every run ended well, else 1 (130 when interrupted)."""
    with launching(settings, label) as (launcher, signals):
        for slot in slots:
            for spec in slot:
                launcher.check_gpus(spec.gpus, f"{label} line {spec.line}")
        for number, slot in enumerate(slots, 1):
            if launcher.interrupted:
                print(
                    f"tracehouse: interrupted: {len(slots) - number + 1} slots of the matrix not run", file=sys.stderr
                )
                break
            names = ", ".join(spec.name for spec in slot)
            print(f"tracehouse: [{number}/{len(slots)}] {names}", file=sys.stderr, flush=True)
            for finished in launcher.run_slot(slot, signals):
                _say_finished(finished, launcher)
    _say_shipping(launcher)
    _print_summary(settings, launcher.finished, output_format, stored=not launcher.shipping.get("spooled_batches"))
    if launcher.interrupted:
        return 130
    return 0 if all(f.exit_code == 0 for f in launcher.finished) else 1


def _say_finished(finished: Finished, launcher: Launcher) -> None:
    print(f"tracehouse: run {finished.spec.name} ({finished.run_id}): {finished.status} after {finished.seconds:g} s,"
          f" {finished.processes} processes; telemetry: {launcher.telemetry}", file=sys.stderr, flush=True)  # fmt: skip


def _say_shipping(launcher: Launcher) -> None:
    shipping = launcher.shipping
    if shipping.get("spooled_batches"):
        print(f"tracehouse: the server at {launcher.settings.server} did not answer: {shipping['spooled_batches']}"
              f" batches wait in {shipping['spool']}; the next `tracehouse run`, training run or the host's agent"
              " sends them once it answers", file=sys.stderr)  # fmt: skip
    if shipping.get("dropped_batches"):
        print(f"tracehouse: {shipping['dropped_batches']} batches were dropped (the spool was full)", file=sys.stderr)


SUMMARY_COLUMNS = ("name", "status", "exit_code", "duration_s", "sm_util_pct", "gpu_busy_pct", "energy_j",
                   "gpu_mem_peak_bytes", "run_id")  # fmt: skip


def _print_summary(settings: Settings, finished: Sequence[Finished], output_format: str, stored: bool) -> None:
    """The matrix's table: from the Query service when the runs are stored, else what this
    process knows (telemetry figures need the store)."""
    import pandas as pd

    from query.client import Client, QueryFailed
    from tracehouse.output import render

    local = pd.DataFrame(
        [{"name": f.spec.name, "status": f.status, "exit_code": f.exit_code, "duration_s": f.seconds,
          "run_id": f.run_id, **{f"tag.{k}": v for k, v in f.spec.tags.items()}} for f in finished]
    )  # fmt: skip
    if not len(local):
        return
    frame = local
    if stored:
        client = Client(settings.server, timeout=30.0, security=settings.security)
        try:
            figures = client.compare([f.run_id for f in finished])
            frame = summary_of(figures)
        except QueryFailed as error:
            print(f"tracehouse: telemetry figures unavailable ({error}); the runs as this process saw them:",
                  file=sys.stderr)  # fmt: skip
        finally:
            client.close()
    render(frame, output_format)


def summary_of(figures: Any) -> Any:
    """The matrix's summary from Compare's figures: SM utilisation is the run's own (its
    processes' NVML SM %), GPU busy % the traced busy time where traced, else NVML's
    utilisation (the share of time a kernel ran)."""
    frame = figures.copy()
    frame["sm_util_pct"] = frame["proc_sm_util_mean"]
    frame["gpu_busy_pct"] = frame["busy_pct"].where(frame["busy_pct"].notna(), frame["gpu_util_mean"])
    tags = [c for c in frame.columns if str(c).startswith("tag.")]
    return frame[[*SUMMARY_COLUMNS, *tags]]
