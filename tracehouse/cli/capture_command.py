"""`tracehouse capture --run R`: profile the next steps of a running training process, into its run;
`tracehouse captures`: the requests and what came of each."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import Any

from tracehouse.cli.options import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _add_client_security,
    _add_server_option,
    _client_security,
    command_name,
)
from tracehouse.cli.query_command import _connection


def _ranks(text: str) -> tuple[int, ...]:
    from ingest.captures import parse_ranks

    try:
        return parse_ranks(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--ranks: ")) from None


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be more than 0")
        return value

    return parse


def _add_capture(commands: Any) -> None:
    capture = commands.add_parser(
        "capture", help="profile the next steps of a running training process, into its run",
        description="Ask a process recording with tracehouse.run(...) to profile its next steps (torch.profiler) "
        "and import the trace into its run, beside its telemetry. Every rank of a distributed run captures "
        "the same steps.",
    )  # fmt: skip
    capture.add_argument("--run", required=True, metavar="RUN", help="the run: its id, or its name")
    size = capture.add_mutually_exclusive_group()
    size.add_argument("--steps", type=_positive(int), default=0, metavar="N", help="steps to profile (default 10)")
    size.add_argument("--seconds", type=_positive(float), default=0.0, metavar="S",
                      help="profile the steps that begin within S seconds")  # fmt: skip
    capture.add_argument("--ranks", type=_ranks, default=(), metavar="all|0,3",
                         help="only these ranks (RANK) of the run; ranges like 4-7 (default all)")  # fmt: skip
    capture.add_argument("--reason", default="", metavar="TEXT", help="kept with the request")
    capture.add_argument("--wait", type=float, nargs="?", const=300.0, default=None, metavar="SECONDS",
                         help="wait until the capture is imported, or for SECONDS (default 300)")  # fmt: skip
    capture.add_argument("--format", choices=("table", "json"), default="table",
                         help="table for people; json for programs (exact ns and bytes)")  # fmt: skip
    _add_server_option(capture)
    _add_client_security(capture)

    listing = commands.add_parser(
        "captures", help="the captures asked for and what came of each",
        description="Each capture request (who, when, what) and, per process of the run, its outcome: the "
        "steps captured, the trace's size, the events imported, or why not.",
    )  # fmt: skip
    listing.add_argument("--run", default="", metavar="RUN", help="only this run's (its id)")
    listing.add_argument("--limit", type=_positive(int), default=20, help="the most recent N requests (default 20)")
    listing.add_argument("--format", choices=("table", "json", "csv"), default="table",
                         help="table for people; json and csv for programs (exact ns and bytes)")  # fmt: skip
    _add_server_option(listing)
    _add_client_security(listing)


def run_capture(args: argparse.Namespace) -> int:
    from query.client import Client, QueryFailed

    client = Client(args.server, timeout=30, security=_client_security(args))
    try:
        asked = client.capture(args.run, steps=args.steps, seconds=args.seconds, ranks=args.ranks, reason=args.reason)
        if args.wait is not None:
            print(f"asked: capture {asked['request_id']} of run {asked['run_id']}; waiting up to {args.wait:g} s",
                  file=sys.stderr)  # fmt: skip
            deadline = time.monotonic() + args.wait
            while not _finished(asked) and time.monotonic() < deadline:
                time.sleep(0.5)
                asked = client.capture_state(asked["request_id"], asked["run_id"])
    except QueryFailed as error:
        return _refused(error, args.typed)
    finally:
        client.close()
    if args.format == "json":
        print(json.dumps(asked))
    else:
        _print_table([asked])
        if args.wait is None or not _finished(asked):
            again = ["captures", "--run", asked["run_id"], *_connection(args.typed)]
            print(f"\n{command_name()} {shlex.join(again)} shows what came of it")
    if args.wait is None:
        return 0
    if not _finished(asked):
        print(f"tracehouse: capture {asked['request_id']} is still {asked['state']} after {args.wait:g} s",
              file=sys.stderr)  # fmt: skip
        return EXIT_UNAVAILABLE
    return 0 if any(o["state"] == "imported" for o in asked["outcomes"]) else EXIT_UNAVAILABLE


def _finished(asked: dict[str, Any]) -> bool:
    """Through: expired, or done with every rank asked heard from (others may still take it meanwhile)."""
    if asked["state"] == "expired":
        return True
    heard = {o["rank"] for o in asked["outcomes"]}
    return asked["state"] == "done" and set(asked["ranks"]) <= heard


def run_captures(args: argparse.Namespace) -> int:
    from query.captureframe import captures_frame
    from query.client import Client, QueryFailed

    client = Client(args.server, timeout=30, security=_client_security(args))
    try:
        found = client.capture_list(args.run, args.limit)
    except QueryFailed as error:
        return _refused(error, args.typed)
    finally:
        client.close()
    if args.format == "json":
        print(json.dumps(found))
    elif args.format == "csv":
        captures_frame(found).to_csv(sys.stdout, index=False)
    else:
        _print_table(found)
    return 0


def _refused(error: Any, typed: list[str]) -> int:
    """Say why the server refused (its hint as this user runs it) and exit as for that reason."""
    print(f"tracehouse: {_pasteable(error.message, typed)}", file=sys.stderr)
    later = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")  # asked again later, it may be answered
    return EXIT_UNAVAILABLE if error.code.name in later else EXIT_USAGE


def _pasteable(message: str, typed: list[str]) -> str:
    """The server's message with its `tracehouse captures ...` hint as this user runs it against this server."""
    flags = _connection(typed)
    hint = "`tracehouse captures "
    if hint not in message:
        return message
    head, _, tail = message.partition(hint)
    command, tick, rest = tail.partition("`")
    extra = f" {shlex.join(flags)}" if flags else ""
    return f"{head}`{command_name()} captures {command}{extra}{tick}{rest}"


def _print_table(captures: list[dict[str, Any]]) -> None:
    import pandas as pd

    from query.captureframe import captures_frame
    from tracehouse.cli.output import table_text

    if not captures:
        print("(no captures)")
        return
    frame = captures_frame(captures)
    frame["requested_ns"] = pd.to_datetime(frame["requested_ns"], unit="ns", utc=True)
    shown = frame.rename(columns={"requested_ns": "requested", "request_id": "capture", "run_id": "run"})
    sys.stdout.write(table_text(shown))
