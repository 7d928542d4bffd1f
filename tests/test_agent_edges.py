"""The agent's and the importer's edges: what comes from outside (trace files, the spool folder,
matrix and config files, signals, numeric options) is bounded, refused in one line, or counted."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from agent.traces.nsys_strings import cut
from agent.traces.nsys_synthetic import KERNELS, write_export
from query.client import Client

ROOT = Path(__file__).resolve().parents[1]
MAX_STRING = 64 << 10
MEASURED = (
    "import sys; from tracehouse.cli.main import main; code = main(sys.argv[1:]); "
    "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0], file=sys.stderr); sys.exit(code)"
)


def import_measured(path: Path, address: str, host: str) -> tuple[int, str, int]:
    """`tracehouse import PATH` in a child process: its exit status, stderr, and peak RSS in bytes."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, "import", "--server", address, "--host", host, str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    *said, peak = done.stderr.strip().splitlines()  # VmHWM, in KiB: ru_maxrss would count the parent's
    return done.returncode, "\n".join(said), int(peak) << 10


def test_huge_strings_of_an_export_are_cut_while_read(tmp_path: Path, address: str, client: Client) -> None:
    """Five kernel names of 40 MB each: SQLite hands over no more than the bound of each, so the
    importer's peak memory does not grow with them, and the stored names are cut to 64 KiB on a
    character boundary."""
    plain, huge = tmp_path / "plain.sqlite", tmp_path / "huge.sqlite"
    write_export(plain)
    write_export(huge)
    long_names = {name: f"{name} " + "€" * ((40 << 20) // 3) for name in KERNELS}  # 3-byte chars: cuts split them
    with sqlite3.connect(huge) as connection:
        for name, long in long_names.items():
            connection.execute("UPDATE StringIds SET value = ? WHERE value = ?", (long, name))
    total = sum(len(long.encode()) for long in long_names.values())
    expected = {cut(long, MAX_STRING) for long in long_names.values()}
    del long_names

    status, stderr, baseline = import_measured(plain, address, "plain")
    assert status == 0, stderr[-2000:]
    status, stderr, peak = import_measured(huge, address, "huge")
    assert status == 0, stderr[-2000:]
    print(f"peak RSS: {baseline >> 20} MiB plain, {peak >> 20} MiB with {total >> 20} MiB of names")
    assert peak - baseline < total // 2, f"peak RSS grew {(peak - baseline) >> 20} MiB for {total >> 20} MiB of names"

    names = client.sql("SELECT DISTINCT name FROM events WHERE kind = 'kernel' AND host = 'huge'")["name"]
    assert set(names) == expected
    assert all(MAX_STRING - 3 < len(name.encode()) <= MAX_STRING for name in names)
