"""What `tracehouse query` adds to a refusal so that a person can go on: the profiler steps a run has
when the one asked is not there, and a hint for SQL whose durations in ns are
not named so. Hints are commands that run when pasted (command_name, the user's own options)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tracehouse.cli.options import command_name

if TYPE_CHECKING:
    import pandas as pd

    from query.client import Client

PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)")
STEPS_LISTED = 5  # step numbers a hint names
MAX_STEPS_READ = 100_000  # the run's steps read to find one


def without(option: str, typed: Sequence[str]) -> list[str]:
    """`typed` less `option` and its value."""
    out: list[str] = []
    skip = False
    for arg in typed:
        if skip or arg.startswith(option + "="):
            skip = False
            continue
        if arg == option:
            skip = True
            continue
        out.append(arg)
    return out


def again(typed: Sequence[str], option: str, value: str) -> str:
    """The command as typed with `option` set to `value`, as it can be pasted here."""
    return f"{command_name()} {shlex.join([*without(option, typed), option, value])}"


def step_numbers(steps: pd.DataFrame) -> list[int]:
    """The profiler step numbers of a run's step events (Kineto's ProfilerStep#N keeps N in extras)."""
    numbers = []
    for extras in steps.get("extras", []):
        found = dict(extras or {}).get("step", "")
        if str(found).isdigit():
            numbers.append(int(found))
    return numbers


def steps_hint(client: Client, args: argparse.Namespace, message: str) -> str:
    """For `--range ProfilerStep#N` that the server did not find (among the ranges, and the steps that
    Kineto's ProfilerStep#N are stored as): the steps there are, as a command that pastes; "" when it
    does not apply."""
    wanted = PROFILER_STEP.fullmatch(getattr(args, "range", None) or "")
    if not wanted or "NOT_FOUND" not in message:
        return ""
    window = {"run": args.run, "host": args.host, "gpu": args.gpu, "start": args.start, "end": args.end}
    numbers = sorted(set(step_numbers(client.events(["step"], limit=MAX_STEPS_READ, **window))))
    typed = getattr(args, "typed", [])
    if not numbers:
        return (
            f"no profiler step {wanted.group(1)} here either: the window has no steps; "
            f"{command_name()} {shlex.join(['query', 'nvtx', *_connection_and_run(typed)])} lists its ranges"
        )
    listed = ", ".join(f"#{n}" for n in numbers[:STEPS_LISTED]) + (" …" if len(numbers) > STEPS_LISTED else "")
    return (
        f"the run's profiler steps are ProfilerStep{listed} ({len(numbers)} stored as steps): "
        f"{again(typed, '--range', f'ProfilerStep#{numbers[0]}')}"
    )


def _connection_and_run(typed: Sequence[str]) -> list[str]:
    from tracehouse.cli.query_command import CONNECTION_OPTIONS, _connection

    return _connection(typed, (*CONNECTION_OPTIONS, "--run"))


NS_SQL = re.compile(r"toUnixTimestamp64Nano|(dateDiff|age|date_diff)\s*\(\s*'(ns|nanosecond)", re.IGNORECASE)


def sql_note(frame: pd.DataFrame, sql: str) -> str:
    """Where SQL computes ns (toUnixTimestamp64Nano, dateDiff('ns', …)) into an integer column whose
    name does not say ns: how to have it read as a duration. A table reads a column as ns durations
    by its name (an `ns` word: total_ns) or its type (an interval, `end - start` of DateTime64(9))."""
    import pandas as pd

    from tracehouse.readable import column_kind

    if not NS_SQL.search(sql):
        return ""
    raw = [
        str(c)
        for c in frame.columns
        if pd.api.types.is_integer_dtype(frame[c].dtype) and column_kind(str(c), frame[c]) in ("text", "number")
    ]
    if not raw:
        return ""
    shown = ", ".join(raw[:3])
    return (
        f"tracehouse: {shown}: plain number{'s' if len(raw) > 1 else ''}; a column reads as a duration where its name "
        f"has an ns word ({raw[0]}_ns) or it is an interval (end - start): AS {raw[0]}_ns names it so"
    )


def drop_empty_ranges(frames: dict[str, Any], asked: int | None) -> dict[str, Any]:
    """nvtx-gpu's answer for a table: its `ranges` section only when --ranges asked for it."""
    return frames if asked else {name: frame for name, frame in frames.items() if name != "ranges"}
