"""Which page of the documentation explains each command: the last line of its --help.

Paths are relative to the repository (docs/ is the MkDocs site); tests check that every command
has a page and that the page exists.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

# A command's page is that of its longest prefix here; "" is `tracehouse` itself.
PAGES: dict[str, str] = {
    "": "docs/getting-started.md",
    "serve": "docs/how-to/deploy.md",
    "up": "docs/getting-started.md",
    "schema": "docs/how-to/deploy.md",
    "ui": "docs/how-to/explorer.md",
    "agent": "docs/how-to/agent.md",
    "run": "docs/how-to/run-and-matrices.md",
    "import": "docs/how-to/import-traces.md",
    "demo-train": "docs/how-to/instrument-training.md",
    "capture": "docs/how-to/capture.md",
    "captures": "docs/how-to/capture.md",
    "query": "docs/how-to/ask-questions.md",
    "query diff": "docs/how-to/compare-runs.md",
    "query compare": "docs/how-to/compare-runs.md",
    "verdict": "docs/how-to/compare-runs.md",
    "job": "docs/how-to/jobs.md",
    "export": "docs/how-to/export-perfetto.md",
    "bench": "docs/benchmarks/index.md",
    "token": "docs/how-to/security.md",
}


def page_for(command: str) -> str:
    """The page of `command` ("query kernels"), from its longest prefix in PAGES."""
    words = command.split()
    while words and " ".join(words) not in PAGES:
        words.pop()
    return PAGES[" ".join(words)]


def subcommands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command under `parser`, depth first, as ("query kernels", its parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                command = f"{path} {name}".strip()
                yield command, sub
                yield from subcommands(sub, command)


def epilog(command: str) -> str:
    return f"Docs: {page_for(command)}"


def add_doc_epilogs(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """End the help of `parser` and of each command under it with the page that explains it."""
    for command, sub in [("", parser), *subcommands(parser)]:
        sub.epilog = f"{sub.epilog}\n\n{epilog(command)}" if sub.epilog else epilog(command)
    return parser
