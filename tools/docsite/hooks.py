"""MkDocs hooks (mkdocs.yml `hooks:`): pages whose body is made from the code at every build.

A page holds a marker line, `<!-- generated: NAME -->` alone on its line; the build puts what NAME makes in its
place, so the CLI reference is the parser `tracehouse` runs and the protocol's the .proto files.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # mkdocs loads this file by path; the generators import the project
    sys.path.insert(0, str(REPO))

from tools.docsite.cli_reference import cli_reference  # noqa: E402
from tools.docsite.proto_reference import proto_reference  # noqa: E402


def _cli(page: str) -> str:
    from tracehouse.cli.main import build_parser

    return cli_reference(build_parser(), page)


def _proto(page: str) -> str:
    return proto_reference()


GENERATORS: dict[str, Callable[[str], str]] = {"cli-reference": _cli, "proto-reference": _proto}


def expand(markdown: str, page: str) -> str:
    """`markdown` with each marker line replaced by what its generator makes for `page`."""
    for name, generate in GENERATORS.items():
        marker = re.compile(rf"^<!-- generated: {re.escape(name)} -->$", re.MULTILINE)  # a line of its own
        parts = marker.split(markdown)
        if len(parts) > 1:
            markdown = generate(page).join(parts)
    return markdown


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown, page.file.src_uri)
