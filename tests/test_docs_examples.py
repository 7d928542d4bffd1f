"""Every example in the README and the docs (a block marked `<!-- example -->`, see
tools/docsite/examples.py) runs, as a reader would paste it, against a real server holding the
demo's two runs, with real Nsight and Kineto files in the folder it runs in: a renamed command or
flag fails here."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from store.store import Store
from tests.conftest import FIXTURES
from tools.docsite.examples import Example, examples
from tracehouse.cli.demo import load_demo
from tracehouse.cli.serve import create_server
from tracehouse.model import DEFAULT_LIMITS

REPO = Path(__file__).resolve().parents[1]
# What the examples' folder holds, as the docs name the files
FILES = {
    "report1.sqlite": FIXTURES / "nsys" / "nsys-2026.1-test-cuda.sqlite",
    "report2.sqlite": FIXTURES / "nsys" / "nsys-2021.2-mordred-report1.sqlite",
    "trace.json.gz": FIXTURES / "kineto" / "critical_path_simple_add_benchmark_result_493459_1694039959_trace.json.gz",
}
# A reader runs one command at a time; the test runs three pages at once, whose reads wait for a
# place at the server's reader gate instead of being turned away after half a second (a flaky exit 1)
PATIENT = dataclasses.replace(DEFAULT_LIMITS, query_queue_seconds=60.0, sql_queue_seconds=60.0)
EXAMPLE_TIMEOUT_S = 120  # a block of a few commands on a loaded machine
WORKERS = 3  # documents at once: an example waits on its own process and the server more than on the CPU


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def all_examples() -> list[Example]:
    return [example for path in documents() for example in examples(path)]


@pytest.fixture
def server_with_demo(tmp_path: Path, migrated_store: Path) -> Iterator[str]:
    shutil.copytree(migrated_store, tmp_path / "store", symlinks=True)
    store = Store.open(f"chdb://{tmp_path / 'store'}", PATIENT)
    server = create_server(store, "127.0.0.1:0", PATIENT)
    address = f"127.0.0.1:{server.port}"
    try:
        load_demo(address, socket.gethostname(), time.time_ns())
        yield address
    finally:
        server.stop(grace=5)
        store.close()


def run_example(example: Example, folder: Path, env: dict[str, str]) -> str | None:
    """None when the example ends as it says it does, else what went wrong."""
    if example.file:
        (folder / example.file).write_text(example.code, encoding="utf-8")
        return None
    if example.language == "bash":
        command = ["bash", "-euo", "pipefail", "-c", example.code]
    else:
        command = [sys.executable, "-c", example.code]
    try:
        done = subprocess.run(
            command, cwd=folder, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"{example.where()}: still running after {EXAMPLE_TIMEOUT_S} s"
    if done.returncode == example.exit:
        return None
    return (
        f"{example.where()}: exit {done.returncode}, the docs say {example.exit}\n"
        f"--- code\n{example.code}--- stdout\n{done.stdout[-2000:]}--- stderr\n{done.stderr[-2000:]}"
    )


def test_the_docs_examples_run(server_with_demo: str, tmp_path: Path) -> None:
    missing = [str(path) for path in FILES.values() if not path.exists()]
    if missing:
        pytest.skip(f"fixtures absent: {', '.join(missing)}")
    found = all_examples()
    assert len(found) >= 10, "the docs lost their examples"
    folder = tmp_path / "work"
    folder.mkdir()
    for name, source in FILES.items():
        shutil.copyfile(source, folder / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # `tracehouse` as installed
        "TRACEHOUSE_SERVER": server_with_demo,
        "TRACEHOUSE_HOME": str(tmp_path / "home"),
        "TRACEHOUSE_RUNTIME_DIR": str(tmp_path / "runtime"),  # no host agent: runs sample nothing of this machine
        "PYTHONPATH": str(REPO),
    }
    # A document's examples run in order (a page may import, then ask); documents side by side
    by_document: dict[Path, list[Example]] = {}
    for example in found:
        by_document.setdefault(example.path, []).append(example)

    def run_document(examples_of_one: list[Example]) -> list[str]:
        return [failure for example in examples_of_one if (failure := run_example(example, folder, env))]

    with ThreadPoolExecutor(WORKERS) as pool:
        failures = [failure for failed in pool.map(run_document, by_document.values()) for failure in failed]
    assert not failures, "\n\n".join(failures)


def test_a_renamed_flag_fails_its_example(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example -->\n```bash\ntracehouse query runs --no-such-flag\n```\n", encoding="utf-8")
    (example,) = examples(page)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    failure = run_example(example, tmp_path, env)
    assert failure is not None and "exit 2, the docs say 0" in failure


def test_a_marker_without_a_block_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example -->\nplain text\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"page.md:1: an example marker must precede"):
        examples(page)


def test_a_file_example_is_written_for_the_next(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: file m.yaml -->\n```yaml\na: 1\n```\n<!-- example -->\n```bash\ngrep -q 'a: 1' m.yaml\n```\n",
        encoding="utf-8",
    )
    written, command = examples(page)
    assert written.file == "m.yaml" and command.file is None
    assert [run_example(e, tmp_path, dict(os.environ)) for e in (written, command)] == [None, None]
