"""Keeps what questions read of each traced run once its import is over (query/kept.py): a thread of
`serve` that looks for runs whose kept rows are missing or of other rows, and makes them. What is not
kept yet is made at each question, so a question never waits for this and never reads what no longer
holds."""

from __future__ import annotations

import logging
import threading
import time

import pyarrow as pa

from query.analysis import keep_gaps, keep_gpus, keep_islands, keep_ranges, phases
from query.kept import KEPT_TABLES, fingerprints, forget_others, kept_answer, mark_kept, to_keep
from query.projection import phase_telemetry
from query.window import Predicates, RunSpan, Window, event_predicates
from store.store import Store
from store.storeerrors import StoreError
from store.usersql import ipc_bytes

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
        if _fingerprint(store, run_id) == generation:
            store.execute(*mark_kept(run_id, generation))
            kept += 1
            if row["again"] and store.sole_writer:
                for table in KEPT_TABLES:
                    store.execute(*forget_others(table, run_id, generation))
            whole_run = event_predicates(Window(), RunSpan(run_id, "", 0, None, False))  # as the Query service asks
            try:
                kept_phases(store, (run_id, generation), whole_run)
            except StoreError as error:  # the first question makes them
                log.warning("could not keep the phases of run %s: %s", run_id, error)
    return kept


def kept_phases(store: Store, kept: tuple[str, int], where: Predicates) -> tuple[bytes, int]:
    """The phases of a kept run (run id, fingerprint) over its whole span (`where`), as an Arrow IPC stream
    and its rows: as kept when the telemetry they read is as it was, else made now, and kept when neither
    the run's rows nor that telemetry changed meanwhile."""
    run_id, generation = kept
    telemetry = _first(store.query(*phase_telemetry(where)))
    asked = {"run_id": run_id, "question": "phases", "generation": generation, "telemetry": telemetry}
    found = store.query(kept_answer(), asked).to_pylist()
    if found:
        return found[0]["answer"], found[0]["rows"]
    table = store.query(*phases(where))
    answer = ipc_bytes(table)
    if _first(store.query(*phase_telemetry(where))) == telemetry and _fingerprint(store, run_id) == generation:
        types = {"generation": pa.uint64(), "telemetry": pa.uint64()}  # fingerprints take all 64 bits
        row = {column: pa.array([value], types.get(column)) for column, value in asked.items()}
        row |= {
            "answer": pa.array([answer], pa.binary()),
            "rows": pa.array([table.num_rows], pa.uint64()),
            "made": pa.array([time.time_ns()], pa.timestamp("ns", "UTC")),
        }
        try:
            store.append("kept_answers", pa.table(row))
        except StoreError as error:  # the answer stands; the next question makes it again
            log.warning("could not keep the phases of run %s: %s", run_id, error)
    return answer, table.num_rows


def _fingerprint(store: Store, run_id: str) -> int | None:
    now = store.query(fingerprints("SELECT {run_id:String}"), {"run_id": run_id}).to_pylist()
    return now[0]["generation"] if now else None


def _first(table: pa.Table) -> int:
    return int(table.column(0)[0].as_py())


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
