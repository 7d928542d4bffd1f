"""`tracehouse query`: the Query service's calls, rendered as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracehouse.cli.options import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _add_client_security,
    _add_server_option,
    _client_security,
    _duration,
    _gpu,
    _positive,
    _tag,
    _time,
)
from tracehouse.model import DEFAULT_LIMITS, EVENT_KINDS, RUN_SOURCES

SUMMARY_KINDS = {
    "kernels": "cuda_gpu_kern_sum",
    "api": "cuda_api_sum",
    "memops": "cuda_gpu_mem_time_sum",
    "memsize": "cuda_gpu_mem_size_sum",
    "nvtx": "nvtx_sum",
}


def _add_window(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("window")
    group.add_argument("--run", default="", help="a run id: its events and its host's telemetry during it")
    group.add_argument("--from", dest="start", type=_time, help="ISO-8601, ns since the epoch, or now-15m")
    group.add_argument("--to", dest="end", type=_time, help="exclusive; same forms as --from")
    group.add_argument("--host", action="append", default=[], help="repeat for several")
    group.add_argument("--gpu", action="append", type=_gpu, default=[], help="repeat for several")
    group.add_argument("--range", default=None, metavar="NAME", help="the span of one instance of this NVTX range")
    group.add_argument("--instance", type=_positive, default=None, metavar="I",
                       help="which instance of --range, from 1 in start order (default 1)")  # fmt: skip


def _add_query(commands: Any) -> None:
    query = commands.add_parser("query", help="ask the Query service")
    common = argparse.ArgumentParser(add_help=False)
    _add_server_option(common)
    _add_client_security(common)
    common.add_argument("--format", choices=("table", "json", "csv"), default="table")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds (default %(default)s)")
    sub = query.add_subparsers(dest="what", required=True, metavar="WHAT")

    runs = sub.add_parser("runs", parents=[common], help="runs, newest first")
    runs.add_argument("--host", default="")
    runs.add_argument("--source", choices=RUN_SOURCES)
    runs.add_argument("--name", default="", help="part of the name or run id, any case")
    runs.add_argument("--limit", type=_positive, default=1000)
    runs.add_argument(
        "--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE", help="runs with every such tag"
    )

    devices = sub.add_parser("devices", parents=[common], help="GPUs per host")
    devices.add_argument("--host", default="")

    metrics = sub.add_parser("metrics", parents=[common], help="series in the window")
    _add_window(metrics)

    series = sub.add_parser("series", parents=[common], help="a downsampled series: min/avg/max/count per bucket")
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

    for kind, report in SUMMARY_KINDS.items():
        summary = sub.add_parser(kind, parents=[common], help=f"per name, like nsys stats {report}")
        _add_window(summary)
        summary.add_argument("--limit", type=_positive, default=None, help="the top N names by total")

    gpu_time = sub.add_parser("gpu-time", parents=[common], help="busy and idle time per GPU, and idle gaps")
    _add_window(gpu_time)
    gpu_time.add_argument(
        "--min-gap",
        type=_duration,
        default=1_000_000,
        metavar="DURATION",
        help="idle gaps longer than this (default 1ms)",
    )
    gpu_time.add_argument("--max-gaps", type=_positive, default=1000, help="the longest N gaps (default %(default)s)")
    nvtx_gpu = sub.add_parser("nvtx-gpu", parents=[common], help="NVTX ranges projected onto the GPU work they launch")
    _add_window(nvtx_gpu)
    nvtx_gpu.add_argument("--ranges", type=_positive, default=None, metavar="N",
                          help="also list the first N ranges, each with its projection")  # fmt: skip
    phases = sub.add_parser("phases", parents=[common], help="GPU busy %% and telemetry inside each phase")
    _add_window(phases)
    launch = sub.add_parser("launch", parents=[common], help="launch latency, short kernels, idle after syncs")
    _add_window(launch)
    launch.add_argument(
        "--short",
        type=_duration,
        default=10_000,
        metavar="DURATION",
        help="kernels shorter than this are short (default 10us)",
    )
    diff = sub.add_parser("diff", parents=[common], help="two runs side by side, the biggest changes first")
    diff.add_argument(
        "--run", dest="runs", action="append", default=[], required=True, metavar="RUN", help="twice: --run A --run B"
    )
    diff.add_argument(
        "--summary",
        action="append",
        default=[],
        choices=("kernels", "api", "memops"),
        help="which summaries (default all three)",
    )
    diff.add_argument("--limit", type=_positive, default=None, help="the top N changes")

    compare = sub.add_parser("compare", parents=[common], help="runs side by side, one row each")
    compare.add_argument("runs", nargs="*", metavar="RUN", help="run ids, in the order wanted")
    compare.add_argument(
        "--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE",
        help="and the runs with every such tag, newest first",
    )  # fmt: skip
    compare.add_argument("--top-kernels", type=_positive, default=3, metavar="N", help="(default %(default)s)")

    sql = sub.add_parser("sql", parents=[common], help="read-only SQL, limited in time and size")
    sql.add_argument("sql", help="the query; - reads it from stdin")
    sql.add_argument("--max-rows", type=_positive, default=None)


def _window(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "run": args.run, "host": args.host, "gpu": args.gpu, "start": args.start, "end": args.end,
        "range": args.range, "instance": args.instance,
    }  # fmt: skip


def run_query(args: argparse.Namespace) -> int:
    import pandas as pd

    from query.client import Client, QueryFailed
    from tracehouse.cli.output import render, render_many

    client = Client(args.server, timeout=args.timeout, security=_client_security(args))
    frame: pd.DataFrame | dict[str, pd.DataFrame]
    try:
        if args.what == "runs":
            frame = client.runs(args.host, args.source or "", args.name, args.limit, dict(args.tag))
        elif args.what == "devices":
            frame = client.devices(args.host)
        elif args.what == "metrics":
            frame = client.metrics(**_window(args))
        elif args.what == "series":
            frame = client.series(args.metric, args.max_points, **_window(args))
        elif args.what == "events":
            frame = client.events(args.kind, args.name, limit=args.limit, **_window(args))
        elif args.what in SUMMARY_KINDS:
            frame = client.summary(args.what, args.limit or 0, **_window(args))
        elif args.what == "gpu-time":
            frame = client.gpu_time(args.min_gap, args.max_gaps, **_window(args))
        elif args.what == "nvtx-gpu":
            frame = client.nvtx_gpu(args.ranges or 0, **_window(args))
        elif args.what == "phases":
            frame = client.phases(**_window(args))
        elif args.what == "launch":
            frame = client.launch(args.short, **_window(args))
        elif args.what == "diff":
            if len(args.runs) != 2:
                print("tracehouse: diff compares two runs: --run A --run B", file=sys.stderr)
                return EXIT_USAGE
            frame = client.diff(args.runs[0], args.runs[1], args.summary, args.limit or 0)
        elif args.what == "compare":
            if not args.runs and not args.tag:
                print("tracehouse: compare needs run ids, --tag KEY=VALUE, or both", file=sys.stderr)
                return EXIT_USAGE
            frame = client.compare(args.runs, dict(args.tag), args.top_kernels)
            if frame.attrs.get("truncated"):
                print(f"tracehouse: more runs matched; the first {len(frame)} are shown", file=sys.stderr)
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
    if isinstance(frame, dict):
        render_many(frame, args.format)
    else:
        render(frame, args.format)
    return 0
