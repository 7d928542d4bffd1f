"""The `tracehouse ...` command lines the documentation shows, and the options they name that the
parser does not know: a synopsis or an example that a renamed flag left behind."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

FENCE = re.compile(r"^```")
SPAN = re.compile(r"`(tracehouse [^`]+)`")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def command_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each `tracehouse` command in the file's code blocks and code spans;
    a block's indented or backslash-continued lines join the line they continue."""
    lines = path.read_text(encoding="utf-8").splitlines()
    in_block = False
    current: tuple[int, str] | None = None
    for number, line in enumerate(lines, start=1):
        if FENCE.match(line.strip()):
            if current:
                yield current
            current, in_block = None, not in_block
            continue
        if not in_block:
            for span in SPAN.findall(line):
                yield number, span
            continue
        stripped = line.strip().removeprefix("$ ")
        continues = current is not None and (line[:1].isspace() or current[1].endswith("\\"))
        if continues and current is not None:
            current = (current[0], current[1].rstrip("\\") + " " + stripped)
            continue
        if current:
            yield current
        current = (number, stripped) if re.match(r"^(\.venv/bin/)?tracehouse\s", stripped) else None
    if current:
        yield current


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_options(line: str, parser: argparse.ArgumentParser) -> list[str]:
    """The --options of `line` (a `tracehouse ...` command) that its command does not take."""
    text = re.split(r"\s#\s|\s--\s|\s--$|[|>]\s", line.split("tracehouse", 1)[1] + " ", maxsplit=1)[0]
    words = text.split()
    command = parser
    known = set(parser._option_string_actions)
    for word in words:
        choices = _subparsers(command)
        name = word.split("|")[0].strip("[]")
        if name not in choices:
            break
        command = choices[name]
        known |= set(command._option_string_actions)
    return [option for option in OPTION.findall(text) if option not in known]
