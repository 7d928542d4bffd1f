"""The examples in the documentation: fenced code blocks marked to be run by the tests.

A block is an example when the line before its fence is `<!-- example -->` (it must exit 0) or
`<!-- example: exit N -->` (it must exit N). `bash` blocks run in bash with `set -euo pipefail`,
`python` blocks in the project's Python; tests/test_docs_examples.py runs them against a real server.
`<!-- example: file NAME -->` before a block of any language writes it to NAME, for the examples
after it on the page (a matrix file, say) to use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"^<!-- example(?::\s*(?:exit\s+(\d+)|file\s+([\w.-]+)))?\s*-->$")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)")
LANGUAGES = ("bash", "python")


@dataclass(frozen=True)
class Example:
    path: Path
    line: int  # of the fence, from 1
    language: str
    code: str
    exit: int
    file: str | None = None  # a file to write, not a command to run

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def examples(path: Path) -> list[Example]:
    """The marked blocks of a Markdown file, in order; a marker not followed by a runnable block is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for number, line in enumerate(lines):
        marker = MARKER.match(line.strip())
        if not marker:
            continue
        fence = FENCE.match(lines[number + 1]) if number + 1 < len(lines) else None
        file = marker.group(2)
        if not fence or (file is None and fence.group(2) not in LANGUAGES):
            raise ValueError(f"{path}:{number + 1}: an example marker must precede a ```bash or ```python block")
        body = []
        for inner in lines[number + 2 :]:
            if inner.startswith(fence.group(1)):
                break
            body.append(inner)
        else:
            raise ValueError(f"{path}:{number + 2}: the example's block is never closed")
        code = "\n".join(body) + "\n"
        found.append(Example(path, number + 2, fence.group(2), code, int(marker.group(1) or 0), file))
    return found
