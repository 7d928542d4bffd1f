"""The README stays short and its links resolve; every command's --help ends with a docs page that
exists; every option a page shows is one its command takes; the generated references name every
command, option, service and message."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tools.docsite.cli_reference import cli_reference
from tools.docsite.commandlines import command_lines, unknown_options
from tools.docsite.examples import examples
from tools.docsite.hooks import expand
from tools.docsite.screenshots import BROWSER_TEST, copy_screenshots, taken_by_the_browser_test
from tracehouse.cli.docpages import PAGES, epilog, page_for, subcommands
from tracehouse.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 300
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(markdown: str) -> list[str]:
    """The link targets of `markdown` that point into the repository (no scheme, no bare anchor)."""
    outside_code = re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)
    outside_code = re.sub(r"`[^`\n]*`", "", outside_code)
    return [t for t in LINK.findall(outside_code) if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def broken_links(document: Path) -> list[str]:
    broken = []
    for target in relative_links(document.read_text(encoding="utf-8")):
        path = unquote(target.split("#", 1)[0])
        if not (document.parent / path).exists():
            broken.append(target)
    return broken


def test_the_readme_fits_in_300_lines() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_keeps_the_test_command_that_ci_reads() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- test-command -->\n```\n(.*)\n```\n<!-- /test-command -->", text)
    assert found and "pip install -e '.[test]'" in found.group(1) and "pytest" in found.group(1)
    first_block = re.search(r"```\n(.*?)\n```", text, flags=re.DOTALL)
    assert first_block and "tracehouse up" in first_block.group(1), "the first command installs and runs up"


def test_every_relative_link_of_the_readme_and_the_docs_resolves() -> None:
    documents = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = {str(d.relative_to(REPO)): links for d in documents if (links := broken_links(d))}
    assert not broken


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](docs/gone.md#x) `[code](no.md)` [web](https://x.org)\n", encoding="utf-8")
    assert broken_links(page) == ["docs/gone.md#x"]


def test_every_command_help_ends_with_a_docs_page_that_exists() -> None:
    parser = build_parser()
    commands = [("", parser), *subcommands(parser)]
    assert len(commands) > 30
    for command, sub in commands:
        page = page_for(command)
        assert (REPO / page).is_file(), f"tracehouse {command}: {page} does not exist"
        assert sub.format_help().rstrip().endswith(epilog(command)), f"tracehouse {command} --help"


def test_each_page_mapping_names_a_real_command() -> None:
    names = {command for command, _ in subcommands(build_parser())} | {""}
    assert set(PAGES) <= names, f"stale entries: {sorted(set(PAGES) - names)}"


def test_the_cli_reference_names_every_command_and_option() -> None:
    parser = build_parser()
    text = cli_reference(parser)
    for command, sub in subcommands(parser):
        assert f"`tracehouse {command}`" in text
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            for option in action.option_strings:
                assert f"`{option}`" in text, f"tracehouse {command} {option}"


def test_the_docs_pages_hold_the_generation_markers() -> None:
    cli = (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "<!-- generated: cli-reference -->" in cli
    made = expand(cli, "reference/cli.md")
    assert "## `tracehouse verdict`" in made and "`--fail-if-slower`" in made


def test_the_protocol_reference_names_every_service_method_and_message() -> None:
    pytest.importorskip("grpc_tools")
    made = expand("<!-- generated: proto-reference -->", "reference/wire-protocol.md")
    for proto in sorted((REPO / "proto" / "tracehouse" / "v1").glob("*.proto")):
        text = proto.read_text(encoding="utf-8")
        for kind, name in re.findall(r"^\s*(service|message|rpc|enum)\s+(\w+)", text, flags=re.MULTILINE):
            assert f"`{name}`" in made, f"{proto.name}: {kind} {name}"
    assert "Idempotency key chosen by the sender" in made  # a field's comment, as the .proto says it


def test_every_how_to_has_an_example_that_runs() -> None:
    pages = sorted((REPO / "docs" / "how-to").glob("*.md"))
    without = [p.name for p in pages if not examples(p) and p.name != "explorer.md"]  # the explorer is a browser
    assert not without


def test_every_option_the_docs_show_is_one_the_command_takes() -> None:
    parser = build_parser()
    documents = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    history = REPO / "docs" / "benchmarks" / "history.md"  # dated: what was run then, as it was typed
    shown = [(d, n, line) for d in documents if d != history for n, line in command_lines(d)]
    assert len(shown) > 100
    unknown = [
        f"{d.relative_to(REPO)}:{n}: {bad} in {line}" for d, n, line in shown if (bad := unknown_options(line, parser))
    ]
    assert not unknown, "\n".join(unknown)


def test_a_renamed_option_in_a_synopsis_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `tracehouse query kernels --limitt 5`.\n\n```\ntracehouse verdict A B [--skip N]\n"
        "                  [--fail-if-slowr 2%]\ntracehouse run --name x -- python t.py --batch 3\n```\n",
        encoding="utf-8",
    )
    found = [unknown_options(line, build_parser()) for _, line in command_lines(page)]
    assert found == [["--limitt"], ["--fail-if-slowr"], []]


def test_the_docs_show_only_pictures_the_browser_test_takes() -> None:
    taken = taken_by_the_browser_test(BROWSER_TEST.read_text(encoding="utf-8"))
    assert {"runs", "timeline", "compare"} <= taken
    documents = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    shown = {
        Path(target).stem
        for d in documents
        for target in relative_links(d.read_text(encoding="utf-8"))
        if "screenshots/" in target
    }
    assert shown and shown <= taken, f"not taken by tests/test_browser.py: {sorted(shown - taken)}"


def test_screenshots_are_copied_from_the_browser_tests_folder(tmp_path: Path) -> None:
    source = tmp_path / "browser"
    source.mkdir()
    (source / "runs.png").write_bytes(b"\x89PNG")
    copied = copy_screenshots(source, tmp_path / "docs")
    assert [p.name for p in copied] == ["runs.png"] and (tmp_path / "docs" / "runs.png").read_bytes() == b"\x89PNG"
    with pytest.raises(FileNotFoundError, match="run the browser test first"):
        copy_screenshots(tmp_path / "empty", tmp_path / "docs")


def test_a_marker_mentioned_in_text_is_left_alone() -> None:
    text = "Write `<!-- generated: cli-reference -->` on a line of its own.\n"
    assert expand(text, "development.md") == text


def test_help_text_reads_in_the_cli_reference_as_typed() -> None:
    parser = argparse.ArgumentParser(prog="tracehouse")
    commands = parser.add_subparsers(dest="command")
    sub = commands.add_parser("agent", help="sample GPUs")
    sub.add_argument("--watch", help="exports (*.sqlite) of NCCL_* runs, a <b> | c")
    row = next(line for line in cli_reference(parser).splitlines() if line.startswith("| `--watch`"))
    assert r"exports (\*.sqlite) of NCCL\_\* runs, a &lt;b> \| c" in row
