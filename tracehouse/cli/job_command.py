"""`tracehouse job ID`: which rank holds a distributed job back, by how much, and why; its collectives."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from tracehouse.cli.options import (
    _add_client_security,
    _add_server_option,
    _client_security,
    _seconds,
    failed_call_exit,
)

if TYPE_CHECKING:
    import pandas as pd

    from query.jobclient import JobView

TABLE_ROWS = 20  # ranks shown in a table; the rest with --format csv or json


def _add_job(commands: Any) -> None:
    job = commands.add_parser(
        "job", help="a distributed job: which rank holds it back, by how much and why; its collectives",
        description="The job's ranks (their runs name it: --job, job=, or torchrun/Slurm/MPI variables), each "
        "rank's step time in parts (compute, exposed communication, data loading, idle), the stragglers (ranks "
        "and step ranges slower than their peers beyond noise) with the time the job lost to each and why, "
        "its collectives (latency, skew, bandwidth, last arriver) and the ranks' clock alignment.",
    )  # fmt: skip
    job.add_argument("job", metavar="ID", help="the job id its runs name")
    job.add_argument("--steps", default="", metavar="REGEX",
                     help="only the steps whose number this regular expression finds (e.g. '^1[0-9]{2}$')")  # fmt: skip
    job.add_argument("--step-rows", action="store_true", help="also print every rank's steps (json, csv)")
    job.add_argument("--format", choices=("table", "json", "csv", "markdown"), default="table",
                     help="table or markdown for people; json or csv for programs (exact ns, bytes)")  # fmt: skip
    job.add_argument("--timeout", type=_seconds, default=120.0, help="seconds to wait for the answer")
    _add_server_option(job)
    _add_client_security(job)


def run_job(args: argparse.Namespace) -> int:
    from query.client import Client, QueryFailed

    client = Client(args.server, timeout=args.timeout, security=_client_security(args))
    try:
        view = client.job(args.job, args.steps, args.step_rows)
    except QueryFailed as error:
        print(f"tracehouse: {error.message}", file=sys.stderr)
        return failed_call_exit(error.code.name)
    finally:
        client.close()
    _print(view, args)
    return 0


def _frames(view: JobView) -> dict[str, pd.DataFrame]:
    frames = {"stragglers": view.stragglers, "ranks": view.ranks, "collectives": view.collectives,
              "telemetry": view.telemetry}  # fmt: skip
    if view.steps is not None:
        frames["steps"] = view.steps
    return frames


def _print(view: JobView, args: argparse.Namespace) -> None:
    from query.jobclient import headline
    from tracehouse.cli.output import json_document, render_many, table_text

    frames = _frames(view)
    if args.format == "json":
        print(json.dumps({**json_document(frames), "notes": view.notes, "generation": view.generation}))
        return
    if args.format == "csv":
        render_many(frames, "csv")
        return
    if args.format == "markdown":
        print("\n".join(f"- {line.strip()}" for line in headline(view)))
        for name, frame in frames.items():
            print(f"\n### {name}\n")
            print(markdown_table(frame.head(TABLE_ROWS) if name == "ranks" else frame))
    else:
        print("\n".join(headline(view)))
        for name, frame in frames.items():
            if name == "steps" or frame.empty:
                continue
            print(f"\n# {name}")
            print(table_text(frame.head(TABLE_ROWS) if name == "ranks" else frame), end="")
        if len(view.ranks) > TABLE_ROWS:
            print(f"({len(view.ranks) - TABLE_ROWS} more ranks: --format csv or json lists every one)")
    for note in view.notes:
        print(f"tracehouse: {note}", file=sys.stderr)


def markdown_table(frame: pd.DataFrame) -> str:
    from tracehouse.readable import readable

    if frame.empty:
        return "(no rows)"
    shown = readable(frame)
    escape = lambda text: str(text).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(escape, shown.columns)) + " |", "|" + "---|" * len(shown.columns)]
    lines += ["| " + " | ".join(map(escape, row)) + " |" for row in shown.itertuples(index=False)]
    return "\n".join(lines)
