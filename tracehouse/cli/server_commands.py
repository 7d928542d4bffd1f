"""`tracehouse serve`, `up`, `ui` and `schema`: the server's commands."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ingest.admission import DEFAULT_MAX_PENDING_BYTES, DEFAULT_TARGET_MS
from ingest.commitpolicy import DEFAULT_INTERVAL_S, DEFAULT_MAX_ROWS, CommitPolicy
from tracehouse import __version__, config
from tracehouse.cli.options import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _ack_target_ms,
    _ack_within_ms,
    _add_client_security,
    _add_paths,
    _add_server_option,
    _client_security,
    _commit_interval_ms,
    _port,
    _positive,
    _size,
    _size_text,
)
from tracehouse.model import DEFAULT_LIMITS


def _add_server_security(parser: argparse.ArgumentParser) -> None:
    _add_paths(
        parser.add_argument_group("security"),
        (
            ("--tokens", "FILE", "bearer tokens, a 'SCOPE TOKEN' line each (SCOPE read, write or admin; see "
             "`tracehouse token`); required to listen beyond loopback"),
            ("--tls-cert", "PEM", "serve TLS with this certificate"),
            ("--tls-key", "PEM", "the private key of --tls-cert"),
            ("--tls-client-ca", "PEM", "require client certificates signed by this CA (mTLS)"),
        ),
    )  # fmt: skip


def _add_layout(parser: argparse.ArgumentParser) -> None:
    from store.migrations import RETENTION_NAMES

    group = parser.add_argument_group("schema layout")
    group.add_argument(
        "--cluster",
        default="",
        metavar="NAME",
        help="a ClickHouse cluster: Replicated tables on each node, Distributed tables over them",
    )
    group.add_argument(
        "--shards-by",
        choices=("host", "run_id"),
        default="host",
        help="what spreads samples and events over shards (default %(default)s)",
    )
    group.add_argument(
        "--retention",
        action="append",
        default=[],
        metavar="TABLE=DURATION",
        help=f"keep rows this long, e.g. samples=30d, rollups=1y, events=forever; TABLE: {', '.join(RETENTION_NAMES)}",
    )


def _add_schema(commands: Any) -> None:
    schema = commands.add_parser("schema", help="print the DDL of the store's tables, for clickhouse-client")
    schema.add_argument("--database", default="tracehouse", help="(default %(default)s)")
    _add_layout(schema)


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the Ingest and Query services")
    serve.add_argument("--listen", default=config.DEFAULT_LISTEN, help="host:port (default %(default)s)")
    serve.add_argument(
        "--store",
        default=None,
        help="chdb://PATH (embedded, the default: $TRACEHOUSE_HOME/store) or http(s)://user:password@host:port/db",
    )
    serve.add_argument(
        "--store-password-file",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"the ClickHouse password for an http(s) store (or ${config.ENV_STORE_PASSWORD})",
    )
    serve.add_argument("--grace", type=float, default=30.0, help="seconds calls in flight get to finish on stop")
    _add_layout(serve)
    up = commands.add_parser("up", help="run everything on this machine with the embedded store")
    up.add_argument("--listen", default=config.DEFAULT_LISTEN, help="host:port (default %(default)s)")
    up.add_argument("--ui-port", type=_port, default=8501, help="port of the UI on 127.0.0.1 (default %(default)s)")
    up.add_argument("--no-ui", action="store_true", help="run the server and the agent only")
    up.add_argument("--demo", action="store_true", help="also import two generated Nsight-style runs")
    for parser in (serve, up):
        parser.add_argument(
            "--max-pending-bytes",
            type=_size,
            default=_size_text(DEFAULT_MAX_PENDING_BYTES),
            metavar="SIZE",
            help="bytes of writes accepted but not yet stored; past it writers are told to retry later "
            "(default %(default)s)",
        )
        parser.add_argument(
            "--ack-target-ms",
            type=_ack_target_ms,
            default=DEFAULT_TARGET_MS,
            metavar="MS",
            help="take no more writes at once than the store stores within MS milliseconds at its recent "
            "pace; past it writers are told to retry later (default %(default)s)",
        )
        parser.add_argument(
            "--commit-interval-ms",
            type=_commit_interval_ms,
            default=round(DEFAULT_INTERVAL_S * 1000),
            metavar="MS",
            help="the batches of all writers are stored together, one insert per table at most every MS "
            "milliseconds (default %(default)s; 0: as soon as the one before is stored)",
        )
        acks = parser.add_mutually_exclusive_group()
        acks.add_argument(
            "--ack-within-ms",
            type=_ack_within_ms,
            default=0,
            metavar="MS",
            help="a writer is answered once its batch is claimed (kept whole in the store, stored once "
            "whatever fails; reads through this server wait for it), or once stored if that comes within MS "
            "milliseconds (default %(default)s); batches that describe runs, and import chunks, are answered "
            "once stored",
        )
        acks.add_argument(
            "--ack-once-stored",
            action="store_true",
            help="answer every writer only once its batch is in the tables (but while writers are being told "
            "to retry later): lower throughput, and reads through any server see what was answered",
        )
        parser.add_argument(
            "--commit-rows",
            type=_positive,
            default=DEFAULT_MAX_ROWS,
            metavar="ROWS",
            help="store the batches waiting sooner once they hold ROWS rows, and at most ROWS rows a group "
            "(default %(default)s)",
        )
        parser.add_argument(
            "--query-max-concurrent",
            type=_positive,
            default=DEFAULT_LIMITS.query_max_concurrent,
            metavar="N",
            help="the server's own reads (queries, the UI) running at once; past it a read waits "
            f"{DEFAULT_LIMITS.query_queue_seconds:g} s for a place, then is told to retry; writes never wait for "
            "reads (default %(default)s)",
        )
        parser.add_argument(
            "--capture-rule",
            type=Path,
            default=None,
            metavar="FILE",
            help="YAML rules that ask running training runs for a capture when their GPUs' telemetry says so "
            "(docs/how-to/capture.md, Capture on a rule)",
        )
    for parser in (serve, up):
        _add_server_security(parser)
    ui = commands.add_parser("ui", help="run the Streamlit explorer against a server")
    _add_server_option(ui)
    _add_client_security(ui)
    ui.add_argument("--port", type=_port, default=8501, help="port to serve the UI on (default %(default)s)")
    ui.add_argument("--address", default="127.0.0.1", help="address to bind (default %(default)s: this machine only)")


def _store_url(args: argparse.Namespace) -> str:
    """--store (or the environment's), with a password from a file or the environment."""
    import os

    from store.location import with_password
    from tracehouse.regularfile import FileRefused, read_regular

    url = getattr(args, "store", None) or config.default_store_url()
    path = getattr(args, "store_password_file", None)
    if path is not None:
        try:
            return with_password(url, read_regular(path, 64 << 10).decode().rstrip("\r\n"))
        except FileRefused as refused:
            raise ValueError(f"--store-password-file {refused}") from None
        except UnicodeDecodeError:
            raise ValueError(f"--store-password-file {path}: not UTF-8 text") from None
    password = os.environ.get(config.ENV_STORE_PASSWORD)
    return with_password(url, password) if password and not url.startswith("chdb://") else url


def _layout(args: argparse.Namespace) -> dict[str, Any]:
    from store.migrations import retention

    return {"cluster": args.cluster, "shards_by": args.shards_by, "retention": retention(args.retention)}


def run_schema(args: argparse.Namespace) -> int:
    from store.migrations import script
    from store.schema import Layout

    try:
        layout = Layout(args.database, **_layout(args))
    except ValueError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"-- tracehouse {__version__} schema; run with: clickhouse-client --multiquery < this-file")
    for statement in script(layout):
        print(f"{statement.strip()};\n")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from ingest.capture_rules import load_rules
    from store.storeerrors import StoreUnavailable
    from tracehouse.cli.serve import serve
    from tracehouse.cli.up import Up
    from tracehouse.security import SecurityError, load_server_security

    try:
        store = _store_url(args)
        layout = _layout(args) if args.command == "serve" else {}
        rules = load_rules(args.capture_rule) if args.capture_rule is not None else []
    except ValueError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    up = Up(None if args.no_ui else args.ui_port, args.demo) if args.command == "up" else None
    try:
        security = load_server_security(args.tokens, args.tls_cert, args.tls_key, args.tls_client_ca)
        if up is not None:
            security = up.secure(security)
        return serve(
            store,
            args.listen,
            replace(DEFAULT_LIMITS, query_max_concurrent=args.query_max_concurrent),
            getattr(args, "grace", 30.0),
            on_ready=up.start if up else None,
            on_stop=up.stop if up else None,
            max_pending_bytes=args.max_pending_bytes,
            ack_target_ms=args.ack_target_ms,
            security=security,
            layout=layout,
            commit=CommitPolicy(
                args.commit_interval_ms / 1000,
                args.commit_rows,
                None if args.ack_once_stored else args.ack_within_ms / 1000,
            ),
            capture_rules=rules,
        )
    except SecurityError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (StoreUnavailable, OSError, ValueError, RuntimeError) as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def run_ui(args: argparse.Namespace) -> int:
    from agent.runs.children import stop_on_signals
    from tracehouse.cli.serve import is_loopback
    from tracehouse.cli.up import start_ui, stop_process

    server = args.server or config.default_server()
    if not is_loopback(f"{args.address}:{args.port}"):
        print(
            f"tracehouse: the UI on {args.address} has no login: anyone who can reach it can read the store",
            file=sys.stderr,
        )
    security = _client_security(args)
    with stop_on_signals():  # SIGTERM, SIGINT, SIGHUP: the UI's process is stopped too
        try:
            process = start_ui(server, args.port, args.address, security)
        except RuntimeError as error:
            print(f"tracehouse: {error}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except KeyboardInterrupt:
            return 0  # start_ui stopped it
        print(f"tracehouse UI: http://{args.address}:{args.port} (server {server}); Ctrl-C stops it.", flush=True)
        try:
            return process.wait()
        except KeyboardInterrupt:
            stop_process(process)
            return 0
