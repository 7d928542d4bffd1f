"""`tracehouse query`: the Query service's calls, rendered as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tracehouse.cli.options import (
    EXIT_USAGE,
    _add_client_security,
    _add_run_and_times,
    _add_server_option,
    _client_security,
    _duration,
    _gpu,
    _positive,
    _tag,
    command_name,
    failed_call_exit,
)
from tracehouse.model import DEFAULT_LIMITS, EVENT_KINDS, RUN_SOURCES

if TYPE_CHECKING:
    import pandas as pd

    from query.client import Client

TABLE_GAPS = 20  # gaps a table shows unless --max-gaps says otherwise
DATA_GAPS = 1000
CONNECTION_OPTIONS = ("--server", "--token-file", "--tls-ca", "--tls-cert", "--tls-key")

SUMMARY_KINDS = {
    "kernels": "cuda_gpu_kern_sum",
    "api": "cuda_api_sum",
    "memops": "cuda_gpu_mem_time_sum",
    "memsize": "cuda_gpu_mem_size_sum",
    "nvtx": "nvtx_sum",
}


def _add_window(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("window")
    _add_run_and_times(group)
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
    common.add_argument(
        "--format", choices=("table", "json", "csv"), default="table",
        help="table for people (human units); json and csv for programs (exact ns and bytes)",
    )  # fmt: skip
    common.add_argument("--wide", "--full-names", dest="wide", action="store_true",
                        help="tables: whole names (not their short forms), ids and attributes")  # fmt: skip
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
    gpu_time.add_argument(
        "--max-gaps", type=_positive, default=None, metavar="N",
        help=f"the longest N gaps (default {TABLE_GAPS} in a table, {DATA_GAPS} in json and csv)",
    )  # fmt: skip
    gpu_time.add_argument(
        "--over", choices=("run", "profiler-steps"), default="run",
        help="busy %% over the run's window (default), or over its profiler steps on the GPU (ProfilerStep#N, "
        "as AMD TraceLens measures it); each row's window column says which",
    )  # fmt: skip
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
    diff.add_argument("pair", nargs="*", metavar="RUN", help="the two runs, A then B (ids or names)")
    diff.add_argument("--run", dest="runs", action="append", default=[], metavar="RUN", help="or --run A --run B")
    diff.add_argument(
        "--summary",
        action="append",
        default=[],
        choices=("kernels", "api", "memops"),
        help="which summaries (default all three)",
    )
    diff.add_argument("--limit", type=_positive, default=None, help="the top N changes")

    compare = sub.add_parser("compare", parents=[common], help="runs side by side, one row each")
    compare.add_argument("runs", nargs="*", metavar="RUN", help="run ids or names, in the order wanted")
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
    from query.client import Client, QueryFailed

    client = Client(args.server, timeout=args.timeout, security=_client_security(args))
    try:
        return _answer(client, args)
    except QueryFailed as error:
        from tracehouse.cli.query_hints import steps_hint

        hint = steps_hint(client, args, str(error))
        print(f"tracehouse: {pasteable(str(error), getattr(args, 'typed', []))}", file=sys.stderr)
        if hint:
            print(f"tracehouse: {hint}", file=sys.stderr)
        return failed_call_exit(error.code.name)
    finally:
        client.close()


def _answer(client: Client, args: argparse.Namespace) -> int:
    """Ask, then print the answer (and, in a table, what a person reads first or next)."""
    from tracehouse.cli.output import render, render_many

    table = args.format == "table"
    frame: pd.DataFrame | dict[str, pd.DataFrame]
    note = ""  # what a table leaves out, said after it
    if args.what == "runs":
        frame = client.runs(args.host, args.source or "", args.name, args.limit, dict(args.tag))
        if table:
            from query.rungpus import gpu_counts

            frame = runs_for_people(frame, gpu_counts(frame, client.devices(), client.compare))
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
        note = both_styles(frame) if table else ""
        if frame.attrs.get("truncated"):
            print(f"tracehouse: answer truncated to the {len(frame)} names that fit in one answer's bytes; "
                  "--limit N asks for the top N", file=sys.stderr)  # fmt: skip
        if table and "name_cut" in frame:  # a cut name ends in … where people read it
            frame = frame.drop(columns="name_cut")
    elif args.what == "gpu-time":
        from query.stepwindow import gpu_time_over

        gaps_asked = args.max_gaps or (TABLE_GAPS if table else DATA_GAPS)
        gpu_time = gpu_time_over(client, args.over, args.min_gap, gaps_asked, **_window(args))
        note = more_gaps(gpu_time["gaps"], args.min_gap, getattr(args, "typed", [])) if table else ""
        frame = gpu_time
    elif args.what == "nvtx-gpu":
        from tracehouse.cli.query_hints import drop_empty_ranges

        frame = client.nvtx_gpu(args.ranges or 0, **_window(args))
        frame = drop_empty_ranges(frame, args.ranges) if args.format != "json" else frame
        note = both_styles(frame["summary"]) if table else ""
    elif args.what == "phases":
        frame = client.phases(**_window(args))
    elif args.what == "launch":
        frame = client.launch(args.short, **_window(args))
    elif args.what == "diff":
        runs = [*args.pair, *args.runs]
        if len(runs) != 2:
            print("tracehouse: diff compares two runs: diff A B (or --run A --run B)", file=sys.stderr)
            return EXIT_USAGE
        frame = client.diff(runs[0], runs[1], args.summary, args.limit or 0)
        if table:
            _headline(client.compare(runs), client.diff(*runs) if args.summary or args.limit else frame)
    elif args.what == "compare":
        if not args.runs and not args.tag:
            print("tracehouse: compare needs run ids or names, --tag KEY=VALUE, or both", file=sys.stderr)
            return EXIT_USAGE
        frame = client.compare(args.runs, dict(args.tag), args.top_kernels)
        if frame.attrs.get("truncated"):
            print(f"tracehouse: more runs matched; the first {len(frame)} are shown", file=sys.stderr)
        if table and len(frame) == 2:
            _headline(frame, client.diff(*frame["run_id"]))
    else:
        text = sys.stdin.read() if args.sql == "-" else args.sql
        frame = client.sql(text, args.max_rows or 0)
        if frame.attrs.get("truncated"):
            print(f"tracehouse: result truncated to {len(frame)} rows", file=sys.stderr)
        if table:
            from tracehouse.cli.query_hints import sql_note

            if note_on_ns := sql_note(frame, text):
                print(note_on_ns, file=sys.stderr)
    if table:
        frame = _clock_for_people(client, args, frame)
    if isinstance(frame, dict):
        render_many(frame, args.format, wide=args.wide)
    else:
        render(frame, args.format, wide=args.wide)
    if note:
        print(note)
    return 0


def _clock_for_people(
    client: Client, args: argparse.Namespace, frame: pd.DataFrame | dict[str, pd.DataFrame]
) -> pd.DataFrame | dict[str, pd.DataFrame]:
    """A table's times where a run has no wall clock: offsets from its start (+3.362 s) for a question
    about one such run (--run), 'no wall clock' for such runs' starts in compare; never 1970 dates."""
    from tracehouse.wallclock import as_offsets, run_clock, starts_without_wall_clock

    if args.what == "compare" and not isinstance(frame, dict) and "run_id" in frame:
        runs = client.runs(limit=DEFAULT_LIMITS.max_list_rows)
        relative = dict(zip(runs["run_id"].astype(str), runs["relative_time"].astype(bool), strict=True))
        return starts_without_wall_clock(frame, relative)
    if not getattr(args, "run", ""):
        return frame
    wall_clock, origin = run_clock(client.runs(name_contains=args.run, limit=DEFAULT_LIMITS.max_list_rows), args.run)
    if wall_clock:
        return frame
    if isinstance(frame, dict):
        return {name: as_offsets(part, origin) for name, part in frame.items()}
    return as_offsets(frame, origin)


def _headline(runs: pd.DataFrame, changes: pd.DataFrame) -> None:
    from query.headline import compare_headline

    sentence = compare_headline(runs, changes)
    if sentence:
        print(sentence + "\n")


def more_gaps(gaps: pd.DataFrame, min_gap_ns: int, typed: Sequence[str]) -> str:
    """What a table of the longest gaps leaves out, and the command that lists them all."""
    from tracehouse.units import count, duration

    total = int(gaps.attrs.get("gap_count", len(gaps)))
    if total <= len(gaps):
        return ""
    from tracehouse.cli.query_hints import without

    again = [*without("--max-gaps", typed), "--max-gaps", str(min(total, DEFAULT_LIMITS.max_list_rows))]
    return (
        f"… and {count(total - len(gaps))} more idle gaps longer than {duration(min_gap_ns)}; "
        f"{command_name()} {shlex.join(again)} lists them"
    )


def both_styles(summary: pd.DataFrame, shown: int = 5) -> str:
    """Range names used both as push/pop and as start/end, which have a row per style (as in nsys stats)."""
    if "style" not in summary:
        return ""
    styles = summary[summary["style"] != ""].groupby("name")["style"].nunique()
    names = sorted(styles.index[styles > 1])
    if not names:
        return ""
    listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
    return f"Used both as push/pop and as start/end ranges, so one row per style: {listed}"


def _connection(typed: Sequence[str], options: Sequence[str] = CONNECTION_OPTIONS) -> list[str]:
    """The options of `typed` that say which server to ask and how (`options`), with their values: a hint's
    command needs them too."""
    out: list[str] = []
    for i, arg in enumerate(typed):
        if arg in options and i + 1 < len(typed):
            out += [arg, typed[i + 1]]
        elif arg.split("=", 1)[0] in options and "=" in arg:
            out.append(arg)
    return out


def pasteable(message: str, typed: Sequence[str]) -> str:
    """The server's message on one line, a command it suggests as this user can run it against this server."""
    text = " ".join(message.split()).replace("`tracehouse ", f"`{command_name()} ")
    head, hint, tail = text.rpartition(" tracehouse query ")
    if not hint:
        return text
    flags = _connection(typed)
    return f"{head} {command_name()} query {tail}" + (f" {shlex.join(flags)}" if flags else "")


def runs_for_people(runs: pd.DataFrame, gpus: Mapping[str, int | None]) -> pd.DataFrame:
    """Runs as a table reads them: how long each took and on how many GPUs (query.rungpus's one
    definition), in place of its end."""
    import pandas as pd

    from tracehouse.readable import run_starts

    took = [None if pd.isna(end) else int((end - start).value) for start, end in zip(runs["start"], runs["end"],
                                                                                      strict=True)]  # fmt: skip
    shown = runs.drop(columns=["end", "relative_time"])
    shown["start"] = run_starts(runs["start"], runs["relative_time"])
    shown.insert(5, "duration_ns", pd.Series(took, index=runs.index, dtype="Int64"))
    shown.insert(6, "gpus", pd.Series([gpus.get(run) for run in runs["run_id"]], index=runs.index, dtype="Int64"))
    return shown
