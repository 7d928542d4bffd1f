"""Import every real fixture (/work/shared/fixtures/{nsys,kineto}) into a fresh `tracehouse serve` and
write each run's answers (kernels, api, memops, memsize, nvtx, gpu-time as `--format json`, and a digest of
its stored events) to one JSON file: run it before and after a change to the import and compare the files.

    python -m tools.fixture_answers OUT.json"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from agent.runs.children import with_parent
from tracehouse.bench.common import _child_environment, serving
from tracehouse.cli.main import main

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
ANSWERS = ("kernels", "api", "memops", "memsize", "nvtx", "gpu-time")
DIGEST = (
    "SELECT kind, count() AS n, sum(cityHash64(start, end, gpu, stream, pid, tid, name, correlation_id, bytes, "
    "depth, toString(extras), launch_start)) AS digest FROM events WHERE run_id = '{run}' GROUP BY kind ORDER BY kind"
)


def _cli(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    if code:
        raise RuntimeError(f"tracehouse {' '.join(args)} exited {code}")
    return out.getvalue()


def answers(files: list[Path]) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="fixture-answers-") as folder, serving(folder) as (address, _):
        for path in files:
            subprocess.run(
                with_parent([sys.executable, "-m", "tracehouse.cli.main", "import", "--server", address, str(path)]),
                env=_child_environment(folder), check=True, capture_output=True,
            )  # fmt: skip
        runs = json.loads(_cli("query", "runs", "--server", address, "--format", "json"))
        for run in sorted(runs, key=lambda r: r["run_id"]):
            run_id = run["run_id"]
            found[run_id] = {
                what: _cli("query", what, "--server", address, "--format", "json", "--run", run_id) for what in ANSWERS
            }
            found[run_id]["events"] = _cli(
                "query", "sql", "--server", address, "--format", "json", DIGEST.format(run=run_id)
            )
    return found


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tools.fixture_answers", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, metavar="OUT.json", help="where the answers are written")
    parser.add_argument("--fixtures", type=Path, default=FIXTURES, help="the fixtures' folder (default %(default)s)")
    args = parser.parse_args()
    files = sorted((args.fixtures / "nsys").glob("*.sqlite")) + sorted((args.fixtures / "kineto").glob("*.json*"))
    if not files:
        parser.error(f"--fixtures: no Nsight export or Kineto trace in {args.fixtures}/nsys or {args.fixtures}/kineto")
    args.out.write_text(json.dumps(answers(files), indent=1, sort_keys=True))
