"""`tracehouse run`: a command, or a matrix of them, as runs."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracehouse import config
from tracehouse.cli.options import (
    EXIT_USAGE,
    _add_client_security,
    _add_server_option,
    _client_security,
    _positive,
    _tag,
    _tick,
)
from tracehouse.jobs import JOB_ENV

if TYPE_CHECKING:
    from agent.runs.children import Signals


def _add_run(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="run a command (or a matrix of them) as a run: telemetry, its processes, exit status",
        description="Run COMMAND as a run: its GPU telemetry (the host's agent, or one started for it), its "
        "process tree (per-process GPU memory and utilisation are attributed to it), exit status, tags. "
        "The exit status is the command's; SIGINT/SIGTERM/SIGHUP are passed on to it.",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="what to run")
    run.add_argument("--name", default="", help="the run's name (default: the command's file name)")
    run.add_argument("--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE", help="repeat for several")
    run.add_argument("--gpus", default=None, metavar="0,1", help="GPUs for the command: sets CUDA_VISIBLE_DEVICES")
    run.add_argument("--nsys", action="store_true", help="profile it under Nsight Systems and import the trace")
    run.add_argument("--nsys-args", default="", metavar="ARGS", help="more options for `nsys profile`, quoted")
    run.add_argument(
        "--nsys-output", type=Path, default=None, metavar="DIR",
        help="where reports and exports are kept (default $TRACEHOUSE_HOME/nsys)",
    )  # fmt: skip
    run.add_argument("--matrix", type=Path, default=None, metavar="FILE",
                     help="run the experiments of a YAML or CSV file one after another")  # fmt: skip
    run.add_argument("--format", choices=("table", "json", "csv"), default="table", help="the matrix's summary")
    _add_server_option(run)
    run.add_argument(
        "--agent", choices=("auto", "start", "none"), default="auto",
        help="telemetry: the host's agent if one runs for this server, else one started for the run (auto); "
        "always start one; none",
    )  # fmt: skip
    run.add_argument("--simulate", type=_positive, metavar="N", help="the started agent samples N simulated GPUs")
    run.add_argument("--interval", type=_tick, default=0.1, help="the started agent's seconds between samples")
    run.add_argument("--env", action="append", default=[], metavar="NAME",
                     help="also record this environment variable (CUDA_VISIBLE_DEVICES, NCCL_*, ... are)")  # fmt: skip
    run.add_argument("--host", default="", help="host name to record (default: this machine's)")
    run.add_argument("--job", default=None, metavar="ID",
                     help="the distributed job the command is (a rank of, where RANK or SLURM_PROCID is set): "
                     "its training runs name it too (TRACEHOUSE_JOB); see `tracehouse job ID`")  # fmt: skip
    run.add_argument(
        "--spool", type=Path, default=None, metavar="DIR",
        help="folder of the runs' spools (default $TRACEHOUSE_HOME/spool/runs)",
    )  # fmt: skip
    _add_client_security(run)


def _job_id(job: str) -> str:
    from agent.runs import runargs
    from tracehouse.jobs import JobError, check_job_id

    try:
        return check_job_id(job, "--job")
    except JobError as error:
        raise runargs.LaunchError(str(error)) from None


def run_run(args: argparse.Namespace) -> int:
    from agent.runs.children import Signals

    with Signals() as signals:  # before anything starts a thread (grpc does): see agent.runs.children
        status = _run_run(args, signals)
    return 128 + signals.late if signals.late else status


def _run_run(args: argparse.Namespace, signals: Signals) -> int:
    import dataclasses
    import shlex
    import socket

    from agent.runs import runargs
    from agent.runs.matrix import MatrixError, load_matrix
    from tracehouse.cli import experiments

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not args.verbose:  # the command's output is what matters on this terminal
        for chatty in ("tracehouse.agent", "tracehouse.runspool"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        if bool(command) == (args.matrix is not None):
            raise runargs.LaunchError("give a COMMAND (after --) or --matrix FILE, not both" if command
                                       else "nothing to run: give a COMMAND after --, or --matrix FILE")  # fmt: skip
        try:
            nsys_args = shlex.split(args.nsys_args)
        except ValueError as error:
            raise runargs.LaunchError(f"--nsys-args {args.nsys_args!r}: {error}") from None
        if nsys_args and not args.nsys:
            raise runargs.LaunchError("--nsys-args: only with --nsys")
        tags = runargs.check_tags(dict(args.tag), "--tag")
        runargs.check_text(args.name, "--name")
        runargs.check_text(args.host, "--host")
        settings = runargs.Settings(
            server=args.server or config.default_server(), server_given=args.server is not None,
            host=args.host or socket.gethostname(), spool_root=args.spool or config.default_spool() / "runs",
            nsys_dir=args.nsys_output or config.home() / "nsys", security=_client_security(args), agent=args.agent,
            simulate=args.simulate, interval=args.interval, record_env=runargs.check_env_names(args.env),
        )  # fmt: skip
        if args.matrix is not None:
            if args.name or args.gpus or args.nsys:
                raise runargs.LaunchError("--matrix: set name, gpus and nsys for each experiment in the file")
            matrix = load_matrix(args.matrix)
            job_env = {JOB_ENV: _job_id(args.job)} if args.job is not None else {}
            slots = [
                tuple(dataclasses.replace(spec, tags=runargs.check_tags(
                    {**tags, **spec.tags}, f"{args.matrix.name} line {spec.line}: tags"), env={**spec.env, **job_env})
                      for spec in slot)
                for slot in matrix.slots
            ]  # fmt: skip
            if any(spec.nsys for slot in slots for spec in slot):
                runargs.nsys_path()
            return experiments.run_matrix(settings, slots, args.matrix.name, args.format, signals)
        gpus = runargs.gpu_list(args.gpus) if args.gpus is not None else None
        if args.nsys:
            runargs.nsys_path()
        spec = runargs.single_spec(command, args.name, tags, gpus, args.nsys, nsys_args)
        if args.job is not None:
            spec = dataclasses.replace(spec, env={**spec.env, JOB_ENV: _job_id(args.job)})
        return experiments.run_one(settings, spec, signals)
    except (runargs.LaunchError, MatrixError) as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return error.status if isinstance(error, runargs.LaunchError) else EXIT_USAGE
