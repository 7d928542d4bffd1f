"""Copy the browser test's screenshots into the docs: `python -m tools.docsite.screenshots`.

tests/test_browser.py loads every page of the explorer in Chromium and keeps a full-page picture of
each in test-artifacts/browser/ (or $TRACEHOUSE_TEST_ARTIFACTS/browser); the docs show those
pictures from docs/screenshots/, so that they show the explorer as it is. Run it after the browser
test, before a release, and commit the pictures that changed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "screenshots"
BROWSER_TEST = REPO / "tests" / "test_browser.py"


def artifacts() -> Path:
    return Path(os.environ.get("TRACEHOUSE_TEST_ARTIFACTS") or REPO / "test-artifacts") / "browser"


def taken_by_the_browser_test(source: str) -> set[str]:
    """The names of the pictures the browser test takes: `visit(page, URL, "name", ...)` and
    `screenshot(page, "name")`."""
    visits = re.findall(r'visit\(\s*page,\s*[^\n]*?,\s*"([\w-]+)"', source)
    shots = re.findall(r'screenshot\(\s*page,\s*"([\w-]+)"\)', source)
    return set(visits) | set(shots)


def copy_screenshots(source: Path, target: Path) -> list[Path]:
    """Copy each PNG of `source` into `target`; the copies, sorted."""
    pictures = sorted(source.glob("*.png"))
    if not pictures:
        raise FileNotFoundError(f"{source}: no screenshots; run the browser test first (tests/test_browser.py)")
    target.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(picture, target / picture.name)) for picture in pictures]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docsite.screenshots", description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="source", type=Path, default=artifacts(), help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        copied = copy_screenshots(args.source, SCREENSHOTS)
    except FileNotFoundError as error:
        print(error, file=sys.stderr)
        return 1
    print("\n".join(str(path.relative_to(REPO)) for path in copied))
    return 0


if __name__ == "__main__":
    sys.exit(main())
