"""`tracehouse token`: a fresh 'SCOPE TOKEN' line for a --tokens file."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracehouse.cli.options import EXIT_USAGE


def _add_token(commands: Any) -> None:
    token = commands.add_parser("token", help="print a fresh 'SCOPE TOKEN' line to append to a --tokens file")
    token.add_argument(
        "--scope",
        choices=("read", "write", "admin"),
        default="read",
        help="read: queries (UI, CLI); write: agents and imports; admin: both (default %(default)s)",
    )
    token.add_argument(
        "--hosts", action="append", default=[], metavar="GLOB[,GLOB]",
        help="write/admin: the token writes only rows and runs of hosts matching one of these globs",
    )  # fmt: skip
    token.add_argument(
        "--runs", action="append", default=[], metavar="PREFIX[,PREFIX]",
        help="write/admin: the token writes only rows and runs whose run id starts with one of these",
    )  # fmt: skip


def run_token(args: argparse.Namespace) -> int:
    from tracehouse.security import SecurityError, new_token_line

    hosts = [glob for option in args.hosts for glob in option.split(",")]
    runs = [prefix for option in args.runs for prefix in option.split(",")]
    try:
        print(new_token_line(args.scope, hosts, runs))
    except SecurityError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    return 0
