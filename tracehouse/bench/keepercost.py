"""What the keeper (query/keeper.py) spends on an imported run, measured apart from the import: after
`bench import`'s server has stopped, a process of its own opens the same store, forgets what was kept
(the kept tables emptied) and keeps every imported run again as the keeper does (`keep_runs`). Its CPU
seconds (all threads) are the keeper's cost: the answers kept for questions once an import is over,
which `bench import` leaves out of the import's CPU against the practical floor and reports beside it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from agent.runs.children import with_parent


def keeper_cpu_s(folder: str) -> dict[str, Any]:
    """The keeper's CPU seconds keeping every imported run of the embedded store in `folder` (closed)."""
    from tracehouse.bench.common import _child_environment

    done = subprocess.run(
        with_parent([sys.executable, "-m", "tracehouse.bench.keepercost", folder]),
        env=_child_environment(folder), capture_output=True, text=True, check=True,
    )  # fmt: skip
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def _measure(folder: str) -> dict[str, Any]:
    from query.keeper import keep_runs
    from query.kept import KEPT_TABLES
    from store.store import Store
    from tracehouse.model import DEFAULT_LIMITS

    with Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS) as store:
        for table in (*KEPT_TABLES, "kept_runs"):
            store.execute(f"TRUNCATE TABLE {store.db}.{table}")
        started = time.process_time()
        runs = keep_runs(store)
        return {"cpu_s": time.process_time() - started, "runs": runs}


if __name__ == "__main__":
    print(json.dumps(_measure(sys.argv[1])))
