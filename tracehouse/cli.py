"""The `tracehouse` command."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from tracehouse import __version__, config
from tracehouse.model import DEFAULT_LIMITS, EVENT_KINDS, RUN_SOURCES
from tracehouse.timefmt import parse_time

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2

SUMMARY_KINDS = ("kernels", "api", "memops", "nvtx")


def _time(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value


def _gpu(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU index") from None
    if not -1 <= value <= DEFAULT_LIMITS.max_gpu_index:
        raise argparse.ArgumentTypeError(
            f"{value} is not a GPU index (-1 or 0..{DEFAULT_LIMITS.max_gpu_index})"
        )
    return value


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the Ingest and Query services")
    serve.add_argument("--listen", default=config.DEFAULT_LISTEN, help="host:port (default %(default)s)")
    serve.add_argument(
        "--store",
        default=None,
        help="chdb://PATH (embedded, the default: $TRACEHOUSE_HOME/store) or http(s)://user:password@host:port/db",
    )
    serve.add_argument(
        "--grace", type=float, default=30.0, help="seconds calls in flight get to finish on stop"
    )
    up = commands.add_parser("up", help="run everything on this machine with the embedded store")
    up.add_argument("--listen", default=config.DEFAULT_LISTEN, help="host:port (default %(default)s)")


def _add_window(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("window")
    group.add_argument("--run", default="", help="a run id: its events and its host's telemetry during it")
    group.add_argument("--from", dest="start", type=_time, help="ISO-8601, ns since the epoch, or now-15m")
    group.add_argument("--to", dest="end", type=_time, help="exclusive; same forms as --from")
    group.add_argument("--host", action="append", default=[], help="repeat for several")
    group.add_argument("--gpu", action="append", type=_gpu, default=[], help="repeat for several")


def _add_query(commands: Any) -> None:
    query = commands.add_parser("query", help="ask the Query service")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        default=None,
        help=f"address of tracehouse serve (default ${config.ENV_SERVER} or {config.DEFAULT_SERVER})",
    )
    common.add_argument("--format", choices=("table", "json", "csv"), default="table")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds (default %(default)s)")
    sub = query.add_subparsers(dest="what", required=True, metavar="WHAT")

    runs = sub.add_parser("runs", parents=[common], help="runs, newest first")
    runs.add_argument("--host", default="")
    runs.add_argument("--source", choices=RUN_SOURCES)
    runs.add_argument("--name", default="", help="part of the name, any case")
    runs.add_argument("--limit", type=_positive, default=1000)

    devices = sub.add_parser("devices", parents=[common], help="GPUs per host")
    devices.add_argument("--host", default="")

    metrics = sub.add_parser("metrics", parents=[common], help="series in the window")
    _add_window(metrics)

    series = sub.add_parser(
        "series", parents=[common], help="a downsampled series: min/avg/max/count per bucket"
    )
    _add_window(series)
    series.add_argument("--metric", action="append", required=True, help="repeat for several")
    series.add_argument(
        "--max-points",
        type=_positive,
        default=DEFAULT_LIMITS.default_points,
        help=f"buckets per series (default %(default)s, at most {DEFAULT_LIMITS.max_points})",
    )

    events = sub.add_parser("events", parents=[common], help="events overlapping the window")
    _add_window(events)
    events.add_argument("--kind", action="append", default=[], choices=EVENT_KINDS, metavar="KIND")
    events.add_argument("--name", action="append", default=[], help="exact name; repeat for several")
    events.add_argument("--limit", type=_positive, default=1000, help="rows (default %(default)s)")

    summary = sub.add_parser("summary", parents=[common], help="nsys-stats style summary per name")
    summary.add_argument("kind", choices=SUMMARY_KINDS)
    _add_window(summary)
    summary.add_argument("--limit", type=_positive, default=None, help="top N names by total time")

    sql = sub.add_parser("sql", parents=[common], help="read-only SQL, limited in time and size")
    sql.add_argument("sql", help="the query; - reads it from stdin")
    sql.add_argument("--max-rows", type=_positive, default=None)


def _add_bench(commands: Any) -> None:
    bench = commands.add_parser("bench", help="measure a capability against a baseline; prints JSON")
    sub = bench.add_subparsers(dest="what", required=True, metavar="WHAT")
    ingest = sub.add_parser("ingest", help="rows/s through gRPC into the store vs a direct insert")
    ingest.add_argument("--rows", type=_positive, default=4_000_000, help="sample values per round")
    ingest.add_argument("--batch-rows", type=_positive, default=100_000)
    ingest.add_argument("--rounds", type=_positive, default=3)
    ingest.add_argument("--store", default=None, help="store URL (default: a temporary embedded store)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracehouse", description="GPU telemetry and Nsight Systems traces on one timeline."
    )
    parser.add_argument("--version", action="version", version=f"tracehouse {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    _add_query(commands)
    _add_bench(commands)
    return parser


def _window(args: argparse.Namespace) -> dict[str, Any]:
    return {"run": args.run, "host": args.host, "gpu": args.gpu, "start": args.start, "end": args.end}


def run_query(args: argparse.Namespace) -> int:
    from query.client import Client, QueryFailed
    from tracehouse.output import render

    client = Client(args.server, timeout=args.timeout)
    try:
        if args.what == "runs":
            frame = client.runs(args.host, args.source or "", args.name, args.limit)
        elif args.what == "devices":
            frame = client.devices(args.host)
        elif args.what == "metrics":
            frame = client.metrics(**_window(args))
        elif args.what == "series":
            frame = client.series(args.metric, args.max_points, **_window(args))
        elif args.what == "events":
            frame = client.events(args.kind, args.name, limit=args.limit, **_window(args))
        elif args.what == "summary":
            frame = client.summary(args.kind, args.limit or 0, **_window(args))
        else:
            text = sys.stdin.read() if args.sql == "-" else args.sql
            frame = client.sql(text, args.max_rows or 0)
            if frame.attrs.get("truncated"):
                print(f"tracehouse: result truncated to {len(frame)} rows", file=sys.stderr)
    except QueryFailed as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE if error.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED") else EXIT_USAGE
    finally:
        client.close()
    render(frame, args.format)
    return 0


def _up_banner(address: str) -> None:
    print(
        f"tracehouse is up: gRPC on {address}, embedded store in {config.home()}\n"
        f"  tracehouse query runs --server {address}\n"
        f"  tracehouse query sql 'SELECT count() FROM samples' --server {address}\n"
        "Ctrl-C stops it.",
        flush=True,
    )


def run_serve(args: argparse.Namespace) -> int:
    from ingest.store import StoreUnavailable
    from tracehouse.serve import serve

    store = getattr(args, "store", None) or config.default_store_url()
    try:
        return serve(
            store,
            args.listen,
            DEFAULT_LIMITS,
            getattr(args, "grace", 30.0),
            on_ready=_up_banner if args.command == "up" else None,
        )
    except (StoreUnavailable, OSError, ValueError) as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for chatty in ("urllib3", "clickhouse_connect"):  # their retries are reported by us, once
        logging.getLogger(chatty).setLevel(logging.ERROR)
    if args.command == "query":
        return run_query(args)
    if args.command in ("serve", "up"):
        return run_serve(args)
    if args.command == "bench":
        from tracehouse import bench

        return bench.main(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
