"""`tracehouse verdict A B`: is B faster than A, by how much, how sure, and why; exit 1 when
`--fail-if-slower` is passed (a CI gate)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tracehouse.cli.options import (
    EXIT_USAGE,
    _add_client_security,
    _add_server_option,
    _client_security,
    _duration,
    _seconds,
    failed_call_exit,
)
from tracehouse.model import MAX_EVENT_NS

MEASURES = ("step_time", "throughput", "gpu_busy", "energy", "gpu_util")
EXIT_SLOWER = 1
MAX_SKIP = 2**32 - 1  # what the request carries
MAX_TIMEOUT_S = 86_400.0


def _fraction(text: str) -> float:
    """2% or 0.02 -> 0.02."""
    shown = text.strip()
    try:
        value = float(shown[:-1]) / 100 if shown.endswith("%") else float(shown)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (2%) or a fraction (0.02)") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie between 0 and 100 %")
    return value


def _measures(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in MEASURES:
            raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(MEASURES)}")
    return names


def _skip(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= MAX_SKIP:
        raise argparse.ArgumentTypeError(f"{value} steps: from 0 to {MAX_SKIP:,}")
    return value


def _window(text: str) -> int:
    """A duration of at least 1 ms and at most 366 days, the longest a run's event lasts."""
    value = _duration(text)
    if not 1_000_000 <= value <= MAX_EVENT_NS:
        raise argparse.ArgumentTypeError(f"{text}: a window lasts from 1ms to 366d")
    return value


def _timeout(text: str) -> float:
    value = _seconds(text)
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text} s: at most {MAX_TIMEOUT_S:g} s (a day)")
    return value


def group(text: str) -> list[str] | dict[str, str]:
    """A group on the command line: RUN[,RUN...] (ids or names), or KEY=VALUE[,KEY=VALUE...]
    (every run carrying all those tags: repeats, a matrix cell)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("a group is RUN[,RUN...] or KEY=VALUE[,KEY=VALUE...]")
    tagged = ["=" in item for item in items]
    if any(tagged) and not all(tagged):
        raise argparse.ArgumentTypeError(f"{text!r} mixes runs and tags: a group is one or the other")
    if all(tagged):
        pairs = [item.partition("=") for item in items]
        if any(not key.strip() for key, _, _ in pairs):
            raise argparse.ArgumentTypeError(f"{text!r}: a tag is KEY=VALUE")
        return {key.strip(): value for key, _, value in pairs}
    return items


def _add_verdict(commands: Any) -> None:
    verdict = commands.add_parser(
        "verdict", help="is B faster than A, by how much, how sure, and why",
        description="Compare two groups of runs step by step: B's change per measure with a 95 % interval, "
        "and where the step-time difference comes from. A group is RUN[,RUN...] or KEY=VALUE[,KEY=VALUE...].",
    )  # fmt: skip
    verdict.add_argument("a", type=group, metavar="A", help="the baseline: runs (ids or names) or tags")
    verdict.add_argument("b", type=group, metavar="B", help="the candidate, likewise")
    verdict.add_argument("--measure", type=_measures, default=[], metavar="M[,M...]",
                         help=f"of {', '.join(MEASURES)} (default every one both groups hold)")  # fmt: skip
    verdict.add_argument("--skip", type=_skip, default=None, metavar="N",
                         help="leave out the first N steps of each run (default: warm-up detected)")  # fmt: skip
    verdict.add_argument("--steps", default="", metavar="REGEX",
                         help="NVTX ranges so named are steps where a run has none (default: step, iteration, "
                         "ProfilerStep#N, ...)")  # fmt: skip
    verdict.add_argument("--window", type=_window, default=0, metavar="DURATION",
                         help="runs without steps: compare windows about this long that cover each run whole "
                         "(default 10s)")  # fmt: skip
    verdict.add_argument("--min-effect", type=_fraction, default=0.0, metavar="PCT",
                         help="the smallest change worth telling (default 2%%)")  # fmt: skip
    verdict.add_argument("--fail-if-slower", type=_fraction, default=None, metavar="PCT",
                         help="exit 1 when B may be slower than this (the upper bound of its slowdown)")  # fmt: skip
    verdict.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                         help="table for people; json for programs (exact ns); markdown for a PR comment")  # fmt: skip
    verdict.add_argument("--full-names", "--wide", dest="wide", action="store_true",
                         help="tables: kernels' whole names, not their short forms")  # fmt: skip
    verdict.add_argument("--timeout", type=_timeout, default=120.0, help="seconds (default %(default)s)")
    _add_server_option(verdict)
    _add_client_security(verdict)


def _label(side: list[str] | dict[str, str]) -> str:
    return ",".join(side) if isinstance(side, list) else ",".join(f"{k}={v}" for k, v in side.items())


def run_verdict(args: argparse.Namespace) -> int:
    from query.client import Client, QueryFailed

    client = Client(args.server, timeout=args.timeout, security=_client_security(args))
    try:
        frames = client.verdict(args.a, args.b, args.measure, args.skip, args.steps, args.window, args.min_effect)
    except QueryFailed as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return failed_call_exit(error.code.name)
    finally:
        client.close()
    _print(frames, args)
    if args.format == "table":
        _advise(frames, getattr(args, "typed", []))
    return _gate(frames["measures"], args.fail_if_slower) if args.fail_if_slower is not None else 0


def _print(frames: dict[str, Any], args: argparse.Namespace) -> None:
    from query import verdict_text
    from tracehouse.cli.output import _jsonable, table_text

    if args.format == "json":
        document = {name: [{k: _jsonable(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
                    for name, frame in frames.items()}  # fmt: skip
        document["notes"] = frames["measures"].attrs.get("notes", [])
        print(json.dumps(document))
    elif args.format == "markdown":
        print(verdict_text.markdown(frames, (_label(args.a), _label(args.b))), end="")
    else:  # the rows are text for people already: printed whole (wide), never cut mid-word
        print(verdict_text.headline(frames["measures"], frames["runs"]))
        if not frames["measures"].empty:
            print()
            print(table_text(verdict_text.measures_rows(frames["measures"]), wide=True), end="")
        for name, title in verdict_text.TITLES.items():
            if not frames[name].empty:
                rows = verdict_text.parts_rows(frames[name], total=verdict_text.TOTALS[name], full_names=args.wide)
                print(f"\n{title}")
                print(table_text(rows, wide=True), end="")
        print()
        print(table_text(verdict_text.runs_rows(frames["runs"]), wide=True), end="")
    if args.format != "json":
        for note in frames["measures"].attrs.get("notes", []):
            print(f"tracehouse: {note}", file=sys.stderr)


def _advise(frames: dict[str, Any], typed: list[str]) -> None:
    """When the verdict cannot tell: what to add, as a command that runs when pasted."""
    import shlex

    from query import verdict_text
    from tracehouse.cli.options import command_name
    from tracehouse.cli.query_hints import without

    said, options = verdict_text.advice(frames["measures"], frames["runs"])
    if said:
        print(f"\n{said}")
    if options:
        print(f"  {command_name()} {shlex.join([*without(options[0], typed), *options])}")


def _gate(measures: Any, threshold: float) -> int:
    """EXIT_SLOWER when B's slowdown may pass `threshold`: the upper bound of the step-time change or
    of the throughput loss, whichever the answer lists first (throughput when the batch sizes
    differ); a gate with neither measured fails too (EXIT_USAGE)."""
    from tracehouse.units import missing

    worst, what = None, ""
    for row in measures.to_dict(orient="records"):  # the first of the two, in the answer's order
        if row["measure"] == "step_time" and not missing(row["high"]):
            worst, what = float(row["high"]), "step time"
        elif row["measure"] == "throughput" and not missing(row["low"]):
            worst, what = -float(row["low"]), "throughput loss"
        if worst is not None:
            break
    else:
        print("tracehouse: --fail-if-slower needs a step time or throughput with an interval; neither was measured",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if worst > threshold:
        print(f"tracehouse: B may be up to {100 * worst:.1f} % slower ({what}); the limit is {100 * threshold:g} %",
              file=sys.stderr)  # fmt: skip
        return EXIT_SLOWER
    return 0
