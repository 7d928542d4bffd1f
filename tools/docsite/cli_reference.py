"""The CLI reference, in Markdown, from the argparse parser that `tracehouse` itself runs."""

from __future__ import annotations

import argparse
import contextlib
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path

from tracehouse.cli.docpages import page_for, subcommands

REPO = Path(__file__).resolve().parents[2]
USAGE_COLUMNS = "100"  # usage lines wrap as on a terminal this wide, whatever the build's terminal


@contextlib.contextmanager
def _columns(width: str) -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _prose(text: str) -> str:
    """Help text as a table cell that Markdown shows as typed: `*.sqlite` and `NCCL_*` no emphasis."""
    for special in ("\\", "*", "_", "`"):
        text = text.replace(special, "\\" + special)
    return _cell(text.replace("<", "&lt;"))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action)  # %(default)s and the like, as --help prints them


def _names(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(f"`{name}`" for name in action.option_strings)
        if action.nargs != 0 and (action.metavar or not action.choices):
            metavar = action.metavar or action.dest.upper()
            names += f" `{' '.join(metavar) if isinstance(metavar, tuple) else metavar}`"
        return names
    metavar = action.metavar or action.dest
    return f"`{' '.join(metavar) if isinstance(metavar, tuple) else metavar}`"


def _default(action: argparse.Action) -> str:
    value = action.default
    if action.nargs == 0 or value in (None, argparse.SUPPRESS, [], (), ""):
        return ""
    return f"`{value}`"


def _choices(action: argparse.Action) -> str:
    if not action.choices or isinstance(action, argparse._SubParsersAction):
        return ""
    return ", ".join(f"`{choice}`" for choice in action.choices)


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        rows.append(
            f"| {_names(action)} | {_prose(_help(parser, action))} | {_choices(action)} | {_cell(_default(action))} |"
        )
    if not rows:
        return []
    return ["| option | what | choices | default |", "|---|---|---|---|", *rows, ""]


def _title(page: str) -> str:
    """The page's own title (its first `# ` line), else its path."""
    path = REPO / page
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return page.removeprefix("docs/")


def _link(page: str, here: str) -> str:
    """`page` (docs/how-to/x.md, as --help names it) relative to `here` (reference/cli.md, in docs/)."""
    target = page.removeprefix("docs/")
    return posixpath.relpath(target, posixpath.dirname(here))


def _section(command: str, parser: argparse.ArgumentParser, here: str, level: int) -> list[str]:
    title = f"tracehouse {command}".strip()
    lines = [f"{'#' * level} `{title}`", ""]
    if parser.description:
        lines += [parser.description, ""]
    with _columns(USAGE_COLUMNS):
        usage = parser.format_usage().removeprefix("usage: ").strip()
    lines += ["```text", usage, "```", ""]
    lines += _options_table(parser)
    page = page_for(command)
    lines += [f"Explained in [{_title(page)}]({_link(page, here)}).", ""]
    return lines


def cli_reference(parser: argparse.ArgumentParser, here: str = "reference/cli.md") -> str:
    """Every command of `parser` with its usage, options, defaults and the page that explains it."""
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    lines = ["| command | what it does |", "|---|---|"]
    lines += [f"| [`{name}`](#tracehouse-{name}) | {_prose(text)} |" for name, text in helps.items()]
    lines.append("")
    lines += _section("", parser, here, 2)
    for command, sub in subcommands(parser):
        lines += _section(command, sub, here, 2 + command.count(" "))
    return "\n".join(lines)
