"""Keeps what questions read of each traced run once its import is over (query/kept.py): a thread of
`serve` that looks for runs whose kept rows are missing or of other rows, and makes them. What is not
kept yet is made at each question, so a question never waits for this and never reads what no longer
holds."""

from __future__ import annotations

import logging
import threading

from ingest.store import Store, StoreError
from query.analysis import keep_gaps, keep_gpus, keep_islands, keep_ranges
from query.kept import KEPT_TABLES, fingerprints, forget_others, mark_kept, to_keep

log = logging.getLogger(__name__)

EVERY_S = 600.0  # rows taken by retention, or added with no run described, are found so
SOON_S = 2.0  # after a run is described (an import's end), or the server starts


def keep_runs(store: Store) -> int:
    """Keep what is not kept of every imported traced run; how many runs were kept. A run whose rows
    changed meanwhile is left for the next time."""
    kept = 0
    for row in store.query(to_keep()).to_pylist():
        run_id, generation = row["run_id"], row["generation"]
        store.execute(*keep_ranges(run_id, generation))
        for keep in (keep_islands, keep_gpus, keep_gaps):  # the last two read the first
            store.execute(*keep(run_id, generation))
        now = store.query(fingerprints("SELECT {run_id:String}"), {"run_id": run_id}).to_pylist()
        if now and now[0]["generation"] == generation:
            store.execute(*mark_kept(run_id, generation))
            kept += 1
            if row["again"] and store.sole_writer:
                for table in KEPT_TABLES:
                    store.execute(*forget_others(table, run_id, generation))
    return kept


class Keeper:
    """Keeps soon after a run is described (`described()`: an import ends with its run's description) and
    when `serve` starts, and looks every `every_s` for what changed otherwise: each look fingerprints every
    traced run, a scan of the events' run, kind and start."""

    def __init__(self, store: Store, every_s: float = EVERY_S, soon_s: float = SOON_S) -> None:
        self.store = store
        self.every_s = every_s
        self.soon_s = soon_s
        self._stop = threading.Event()
        self._described = threading.Event()
        self._described.set()
        self._thread = threading.Thread(target=self._run, name="keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def described(self) -> None:
        self._described.set()

    def close(self) -> None:
        self._stop.set()
        self._described.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._described.wait(self.every_s)
            if self._stop.wait(self.soon_s):
                return
            self._described.clear()
            try:
                keep_runs(self.store)
            except StoreError as error:  # questions make what is not kept: nothing is wrong, only slower
                log.warning("could not keep what questions read of imported traces: %s", error)
