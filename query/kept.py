"""What is kept of a traced run once its import is over, so that its questions read a row per range, per
GPU or per island of GPU work instead of joining and sorting the run's events again: its ranges with
their NVTX projection (`kept_ranges`, query/projection.py), its GPUs' busy islands (`kept_islands`),
summed up per GPU (`kept_gpus`), and the gaps between them longest first (`kept_gaps`,
query/analysis.py); and whole answers that read more than its rows (`kept_answers`: phases, which also
read its host's telemetry; query/keeper.py). A traced run's ranges meet its own work only, so all are
fixed while the run's rows are. Rows are added to a run by another trace imported into it and taken by
retention, and never change: so the count of a run's ranges and GPU work and their earliest start (its
fingerprint, four times cheaper to read than their ids) tell whether what is kept (`kept_runs`: of
which fingerprint) still holds. Questions use what is kept only then, and make the rest at once;
query/keeper.py keeps. Rows kept for rows that changed since are never read again; the embedded store
deletes them. Pure: SQL."""

from __future__ import annotations

from collections.abc import Sequence

from query.gpuwork import OWN_RUNS, RANGE_KINDS, WORK_KINDS, Query
from query.window import COMPLETE

KEPT_TABLES = ("kept_ranges", "kept_islands", "kept_gpus", "kept_gaps", "kept_answers")
# part of every fingerprint: a new one when what is kept changes, so that runs kept before are kept again
WHAT_IS_KEPT = 2
_FINGERPRINTED = RANGE_KINDS[:-1] + ", " + WORK_KINDS[1:]
# one thread, in a fixed order, with one insert token per table, run and fingerprint: what two servers
# keep at once, or one keeps again after a failure, is stored once
KEEP_SETTINGS = "max_threads = 1, insert_deduplication_token = {token:String}"


def of_kept(kept: Sequence[tuple[str, int]]) -> tuple[str, dict[str, object]]:
    """SQL that holds for a kept table's rows of the `kept` runs (run id, fingerprint), and its parameters.
    (transform() runs once per run id in a block, where a tuple IN tries every row; of one run, a plain
    equality is several times cheaper still.)"""
    runs, generations = [run for run, _ in kept], [generation for _, generation in kept]
    sql = (
        "run_id = {kept_run_ids:Array(String)}[1] AND generation = {kept_generations:Array(UInt64)}[1]"
        if len(kept) == 1
        else "run_id IN {kept_run_ids:Array(String)} AND "
        "generation = transform(run_id, {kept_run_ids:Array(String)}, {kept_generations:Array(UInt64)}, toUInt64(0))"
    )
    return sql, {"kept_run_ids": runs, "kept_generations": generations}


def keep_token(table: str, run_id: str, generation: int) -> str:
    return f"{table}/{run_id}/{generation}"


def fingerprints(runs: str) -> str:
    """SQL: (run_id, generation, ranges) of each run of `runs` (SQL that selects run ids) with ranges or GPU
    work: the fingerprint of those rows, and how many are ranges."""
    return f"""
SELECT run_id, cityHash64(count(), min(start), {WHAT_IS_KEPT}) AS generation, countIf(kind IN {RANGE_KINDS}) AS ranges
FROM {{db}}.events WHERE kind IN {_FINGERPRINTED} AND run_id IN ({runs}) GROUP BY run_id"""


def kept_runs(runs: str) -> str:
    """SQL: (run_id, generation, kept) of each run of `runs` with ranges or GPU work; kept when what is
    kept of it is of its rows as they are now."""
    return f"""
SELECT run_id, generation, (run_id, generation) IN (SELECT run_id, generation FROM {{db}}.kept_runs FINAL) AS kept
FROM ({fingerprints(runs)}) ORDER BY run_id"""


def to_keep() -> str:
    """SQL: traced runs, imported, whose kept rows are missing or of other rows: (run_id, generation, again),
    again when rows of another fingerprint were kept before."""
    imported = f"SELECT run_id FROM {OWN_RUNS} WHERE {COMPLETE}"
    return f"""
SELECT run_id, generation, run_id IN (SELECT run_id FROM {{db}}.kept_runs) AS again
FROM ({kept_runs(imported)}) WHERE NOT kept ORDER BY run_id"""


def forget_others(table: str, run_id: str, generation: int) -> Query:
    """DELETE of a run's rows of `table` kept for other rows than those of fingerprint `generation` (never
    read again). Only where one process keeps: on a shared store another could be keeping them now."""
    sql = f"DELETE FROM {{db}}.{table} WHERE run_id = {{run_id:String}} AND generation != {{generation:UInt64}}"
    return sql, {"run_id": run_id, "generation": generation}


def mark_kept(run_id: str, generation: int) -> Query:
    """INSERT of the mark that says what is kept of a run is whole, for its rows of fingerprint `generation`."""
    sql = """
INSERT INTO {db}.kept_runs (run_id, generation, made) VALUES ({run_id:String}, {generation:UInt64}, now64(9))"""
    return sql, {"run_id": run_id, "generation": generation}


def kept_answer() -> str:
    """SQL: (answer, rows) of {question:String} kept for run {run_id:String}, where made from its rows of
    fingerprint {generation:UInt64} and telemetry of fingerprint {telemetry:UInt64}; the answer as bytes."""
    return """
SELECT answer, rows FROM {db}.kept_answers FINAL
WHERE run_id = {run_id:String} AND question = {question:String} AND generation = {generation:UInt64}
  AND telemetry = {telemetry:UInt64}
SETTINGS output_format_arrow_string_as_string = 0"""
