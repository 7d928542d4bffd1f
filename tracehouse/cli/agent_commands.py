"""`tracehouse agent`, `import` and `demo-train`: the commands that write samples, traces and runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tracehouse import config
from tracehouse.arrowonly import arrow_without_pandas
from tracehouse.cli.demo_train import BATCH
from tracehouse.cli.options import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _add_client_security,
    _add_server_option,
    _client_security,
    _positive,
    _seconds,
    _size,
    _tag,
    _tick,
    command_name,
    failed_call_exit,
)
from tracehouse.cli.stopping import wait_for_stop


def _add_agent(commands: Any) -> None:
    agent = commands.add_parser("agent", help="sample GPUs and ship the samples to tracehouse serve")
    _add_server_option(agent)
    agent.add_argument("--interval", type=_tick, default=0.1, help="seconds between samples (default %(default)s)")
    agent.add_argument(
        "--slow-interval",
        type=_tick,
        default=1.0,
        help="seconds between slow readings: PCIe, GPM, processes, host (default %(default)s)",
    )
    agent.add_argument("--simulate", type=_positive, metavar="N", help="sample N simulated GPUs instead of NVML")
    agent.add_argument("--run", default="", metavar="NAME", help="name the run these samples belong to")
    agent.add_argument("--host", default="", help="host name to record (default: this machine's)")
    agent.add_argument(
        "--spool",
        type=Path,
        default=None,
        help="folder for batches the server could not take yet (default $TRACEHOUSE_HOME/spool)",
    )
    agent.add_argument(
        "--spool-max-bytes",
        type=_size,
        default=1 << 30,
        metavar="SIZE",
        help="bound on the spool, e.g. 512M (default 1G); the oldest batches go first",
    )
    agent.add_argument(
        "--flush-interval",
        type=_seconds,
        default=2.0,
        help="seconds a batch stays open (default %(default)s)",
    )
    agent.add_argument("--duration", type=_seconds, default=None, metavar="S", help="stop after S seconds")
    _add_client_security(agent)
    agent.add_argument("--no-host-metrics", action="store_true", help="do not sample host CPU and memory")
    agent.add_argument(
        "--watch",
        type=Path,
        default=None,
        metavar="DIR",
        help="import Nsight Systems exports (*.sqlite) that appear in DIR, once they stop growing",
    )


def _add_import(commands: Any) -> None:
    imports = commands.add_parser(
        "import", help="import Nsight Systems SQLite exports and PyTorch-profiler (Kineto) traces"
    )
    imports.add_argument(
        "files", nargs="+", type=Path, metavar="FILE",
        help="nsys export --type sqlite output, or a PyTorch-profiler trace (.json or .json.gz)",
    )  # fmt: skip
    _add_server_option(imports)
    imports.add_argument("--run-name", default="", help="name of the run (default: the file name)")
    imports.add_argument(
        "--host", default="", help="host to file it under (default: the one the file names, else this machine)"
    )
    imports.add_argument(
        "--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE", help="repeat for several"
    )
    imports.add_argument(
        "--job", default=None, metavar="ID",
        help="the files are the ranks of one distributed job, one rank a file: its rank from the trace's "
        "distributedInfo, else the file's place among FILES (from 0); see `tracehouse job ID`",
    )  # fmt: skip
    _add_client_security(imports)


def _add_demo_train(commands: Any) -> None:
    demo = commands.add_parser(
        "demo-train", help="train a small PyTorch model, recorded and profiled, then import its trace (needs torch)"
    )
    demo.add_argument("--steps", type=_positive, default=30, help="training steps (default %(default)s)")
    demo.add_argument("--batch", type=_positive, default=BATCH, help="samples per step (default %(default)s)")
    demo.add_argument(
        "--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE",
        help="tag the run (repeats of one setting share a tag: tracehouse verdict arm=a arm=b)",
    )  # fmt: skip
    _add_server_option(demo)
    demo.add_argument(
        "--trace-dir", type=Path, default=None, metavar="DIR", help="keep the profiler's trace here (default: removed)"
    )
    _add_client_security(demo)


def run_agent(args: argparse.Namespace) -> int:
    import json
    import signal
    import threading

    arrow_without_pandas()
    from agent.daemon import Agent, AgentConfig, open_backend
    from agent.telemetry.gpu import BackendUnavailable

    agent_config = AgentConfig(
        server=args.server or config.default_server(),
        spool=args.spool or config.default_spool(),
        interval=args.interval,
        slow_interval=args.slow_interval,
        flush_interval=args.flush_interval,
        spool_max_bytes=args.spool_max_bytes,
        run_name=args.run,
        host=args.host,
        security=_client_security(args),
        host_metrics=not args.no_host_metrics,
        watch=args.watch,
        host_agent=True,
    )
    if args.watch is not None and not args.watch.is_dir():
        print(f"tracehouse: --watch {args.watch}: not a folder", file=sys.stderr)
        return EXIT_USAGE
    try:
        backend = open_backend(args.simulate)
    except BackendUnavailable as error:
        print(f"tracehouse: {error} (--simulate N samples N simulated GPUs instead)", file=sys.stderr)
        return EXIT_UNAVAILABLE
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # each ships what it holds, then stops
        signal.signal(sig, lambda *_: stop.set())
    agent = Agent(agent_config, backend)
    agent.start()
    wait_for_stop(stop, args.duration)
    print(json.dumps(agent.stop()), flush=True)
    return 0


def run_demo_train(args: argparse.Namespace) -> int:
    import json

    from tracehouse.cli.demo_train import TorchMissing, train

    try:
        result = train(args.steps, args.server or config.default_server(), _client_security(args), args.trace_dir,
                       batch=args.batch, tags=dict(args.tag))  # fmt: skip
    except TorchMissing as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(result), flush=True)
    if "import_error" in result:
        print(f"tracehouse: the profiler's trace was not imported: {result['import_error']}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


def run_import(args: argparse.Namespace) -> int:
    arrow_without_pandas()
    from agent.traces.tracefile import no_collection

    job = None
    if args.job is not None:
        from tracehouse.jobs import JobError, check_job_id

        try:
            job = check_job_id(args.job, "--job")
        except JobError as error:
            print(f"tracehouse: {error}", file=sys.stderr)
            return EXIT_USAGE
    with no_collection():  # for `tracehouse import`, whose process runs nothing else
        return _import_files(args, job)


def _import_files(args: argparse.Namespace, job: str | None) -> int:
    import shlex
    import signal

    from agent.shipping.writer import BatchWriter, WriteFailed
    from agent.traces.importer import import_export
    from agent.traces.tracefile import TraceFileError

    writer = BatchWriter(args.server or config.default_server(), _client_security(args))
    status = 0
    path = args.files[0]
    try:
        for index, path in enumerate(args.files):
            progress = _Progress(path.name) if sys.stderr.isatty() else None
            sent, duplicates = writer.batches, writer.duplicates
            try:
                result = import_export(
                    path, writer, args.run_name, args.host, dict(args.tag), progress,
                    job=None if job is None else _rank_of(job, index, len(args.files)),
                )  # fmt: skip
            except TraceFileError as error:
                print(f"tracehouse: {error}", file=sys.stderr)
                status = max(status, EXIT_USAGE)
                continue
            except WriteFailed as error:
                print(f"tracehouse: {path.name}: {_not_taken(error)}", file=sys.stderr)
                return failed_call_exit(error.code.name)
            except Exception as error:  # a reader's defect: still one line, never a traceback
                reason = (str(error).strip().splitlines() or [""])[0][:200]
                print(f"tracehouse: {path.name}: cannot import it ({type(error).__name__}: {reason})", file=sys.stderr)
                status = max(status, EXIT_USAGE)
                continue
            finally:
                if progress:
                    progress.done()
            if not args.host and result.host == result.run_id:
                print(f"tracehouse: {path.name}: names no host: filed under its run id (--host HOST files it "
                      "under a machine, beside that machine's telemetry)", file=sys.stderr)  # fmt: skip
            stored_before = _stored_before(writer.batches - sent, writer.duplicates - duplicates, result.run_id)
            if stored_before:
                print(f"tracehouse: {path.name}: {stored_before}", file=sys.stderr)
            print(result.json(), flush=True)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends it at once
        stored = writer.abandon()
        again = f"{command_name()} {shlex.join(args.typed)}"
        print(f"tracehouse: {path.name}: interrupted after {stored} batches were stored; its run stays hidden until "
              f"the import is run again, which stores only the rest: {again}", file=sys.stderr)  # fmt: skip
        return 128 + signal.SIGINT
    finally:
        writer.close()
    return status


def _rank_of(job: str, index: int, files: int) -> Callable[[Mapping[str, str]], Mapping[str, str]]:
    from tracehouse.jobs import import_membership

    return lambda attrs: import_membership(job, index, files, attrs).attrs()


def _stored_before(batches: int, duplicates: int, run_id: str) -> str:
    """What a re-import stored: nothing (every batch was stored before), or the rest of an interrupted one."""
    if not batches or not duplicates:
        return ""
    if duplicates == batches:
        return f"stored already, as run {run_id} (imported before): nothing new was stored"
    return f"imported before in part, as run {run_id}: {batches - duplicates} of its {batches} batches were new"


def _not_taken(error: Exception) -> str:
    """The server's refusal, and for a file stored before with other content (another tracehouse
    version, --host or --run-name), that it is: the run it is stored as."""
    import re

    code = getattr(getattr(error, "code", None), "name", "")
    found = re.search(r"batch_id '([^'/]+)/", str(error))
    if code == "ALREADY_EXISTS" and found:
        return (f"imported before, as run {found.group(1)}, with other details (another version of tracehouse, "
                f"--host, --run-name or --tag): it is stored already, and stays as it was ({error})")  # fmt: skip
    return f"the server did not take it: {error}"


class _Progress:
    """One line on a terminal: source, rows so far of about how many."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = 0.0

    def __call__(self, source: str, done: int, expected: int) -> None:
        import time

        now = time.monotonic()
        if now - self.shown > 0.2:
            self.shown = now
            share = done / expected if expected else 1.0
            bar = "#" * int(30 * share)
            print(
                f"\r{self.label} {source:<9} [{bar:<30}] {done:>11,} rows",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def done(self) -> None:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
