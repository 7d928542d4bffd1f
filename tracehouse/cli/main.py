"""The `tracehouse` command: its parser, made of each command group's, and the dispatch to their run_*."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from tracehouse import __version__
from tracehouse.cli.agent_commands import (
    _add_agent,
    _add_demo_train,
    _add_import,
    run_agent,
    run_demo_train,
    run_import,
)
from tracehouse.cli.bench_command import _add_bench
from tracehouse.cli.capture_command import _add_capture, run_capture, run_captures
from tracehouse.cli.docpages import add_doc_epilogs
from tracehouse.cli.export_command import _add_export, run_export
from tracehouse.cli.job_command import _add_job, run_job
from tracehouse.cli.options import with_time_values
from tracehouse.cli.query_command import _add_query, run_query
from tracehouse.cli.run_command import _add_run, run_run
from tracehouse.cli.server_commands import _add_schema, _add_serve, run_schema, run_serve, run_ui
from tracehouse.cli.token_command import _add_token, run_token
from tracehouse.cli.verdict_command import _add_verdict, run_verdict


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracehouse", description="GPU telemetry and Nsight Systems traces on one timeline."
    )
    parser.add_argument("--version", action="version", version=f"tracehouse {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    _add_agent(commands)
    _add_run(commands)
    _add_import(commands)
    _add_demo_train(commands)
    _add_capture(commands)
    _add_query(commands)
    _add_verdict(commands)
    _add_job(commands)
    _add_export(commands)
    _add_bench(commands)
    _add_token(commands)
    _add_schema(commands)
    return add_doc_epilogs(parser)


EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    typed = with_time_values(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(typed)
    args.typed = typed  # for hints that repeat the command with a change
    try:
        status = _dispatch(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:  # the reader went away (`| head`): end quietly, as Python's docs advise,
        with contextlib.suppress(OSError, ValueError):  # with the status of a command that SIGPIPE ended
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for chatty in ("urllib3", "clickhouse_connect"):  # their retries are reported by us, once
        logging.getLogger(chatty).setLevel(logging.ERROR)
    if args.command == "query":
        return run_query(args)
    if args.command == "verdict":
        return run_verdict(args)
    if args.command == "job":
        return run_job(args)
    if args.command == "export":
        return run_export(args)
    if args.command in ("serve", "up"):
        return run_serve(args)
    if args.command == "ui":
        return run_ui(args)
    if args.command == "token":
        return run_token(args)
    if args.command == "agent":
        return run_agent(args)
    if args.command == "import":
        return run_import(args)
    if args.command == "schema":
        return run_schema(args)
    if args.command == "demo-train":
        return run_demo_train(args)
    if args.command == "run":
        return run_run(args)
    if args.command == "capture":
        return run_capture(args)
    if args.command == "captures":
        return run_captures(args)
    if args.command == "bench":
        from tracehouse.bench import main as bench

        return bench.main(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
