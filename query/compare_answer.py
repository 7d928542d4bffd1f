"""Compare's answer: one row per run from the store's answers to the queries of query/compare.py,
with each run's GPUs settled once (query/rungpus.py) before its telemetry is read over them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa

from query.compare import CompareSpan, compare_telemetry, compare_traced
from query.rungpus import indices_text, listed_gpus, recorded_count, run_gpus
from tracehouse.shortnames import unique_short_names

Rows = Callable[[str, dict[str, object]], list[dict[str, Any]]]  # a query's text and parameters -> its rows

COMPARE_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("name", pa.string()), ("status", pa.string()), ("exit_code", pa.int64()),
    ("start", pa.int64()), ("duration_s", pa.float64()), ("gpus", pa.int64()), ("gpu_indices", pa.string()),
    ("energy_j", pa.float64()), ("gpu_util_mean", pa.float64()), ("gpu_util_p95", pa.float64()),
    ("sm_active_mean", pa.float64()), ("proc_sm_util_mean", pa.float64()), ("gpu_mem_peak_bytes", pa.int64()),
    ("busy_pct", pa.float64()), ("kernels", pa.int64()), ("top_kernels", pa.string()),
    ("top_kernels_full", pa.string()),
])  # fmt: skip
TELEMETRY_COLUMNS = (
    "energy_j", "gpu_util_mean", "gpu_util_p95", "sm_active_mean", "proc_sm_util_mean", "gpu_mem_peak_bytes",
)  # fmt: skip


def compare_table(runs: list[dict[str, Any]], top: int, rows: Rows) -> pa.Table:
    """`runs`: rows of compare_runs, in the order to answer. Their traced work first (the GPUs it
    ran on are one source of a run's GPUs), then the telemetry of the runs with absolute times."""
    spans = [CompareSpan(r["run_id"], r["host"], r["start_ns"], r["until_ns"]) for r in runs]
    traced = _by_run(rows(*compare_traced(spans, top))) if spans else {}
    counts, known = {}, {}
    for run in runs:
        attrs, registered = dict(run["attrs"]), tuple(run.get("registered") or ())
        worked = tuple(traced.get(run["run_id"], {}).get("worked") or ())
        counts[run["run_id"]] = count = recorded_count(run["source"], attrs, registered)
        known[run["run_id"]] = run_gpus(count, (listed_gpus(run["source"], attrs), registered, worked))
    absolute = [replace(span, gpus=known[span.run_id]) for span, run in zip(spans, runs, strict=True)
                if not run["relative_time"]]  # fmt: skip
    telemetry = _by_run(rows(*compare_telemetry(absolute))) if absolute else {}
    for run_id, gpus in known.items():
        if not gpus:  # what its telemetry shows, when that many
            known[run_id] = run_gpus(counts[run_id], (telemetry.get(run_id, {}).get("gpus") or (),))
    return _table(runs, counts, known, telemetry, traced)


def _by_run(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["run_id"]: row for row in found}


def top_kernels(names: list[str], shares: list[float], labels: Mapping[str, str]) -> str | None:
    """'gemm (53.3%); softmax (26.7%)': each name as `labels` has it (unique_short_names over every
    run's top names, so that a kernel reads alike in each row), None without kernels."""
    if not names:
        return None
    return "; ".join(f"{labels.get(name, name)} ({share:.1f}%)" for name, share in zip(names, shares, strict=True))


def _exit_code(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _table(
    runs: list[dict[str, Any]],
    counts: Mapping[str, int | None],
    known: Mapping[str, tuple[int, ...]],
    telemetry: Mapping[str, dict[str, Any]],
    traced: Mapping[str, dict[str, Any]],
) -> pa.Table:
    """One row per run, in the order given, then a `tag.<key>` column per tag key of any of them."""
    keys = sorted({key for run in runs for key, _ in run["tags"]})
    labels = unique_short_names(name for work in traced.values() for name in work.get("top_names") or ())
    rows = []
    for run in runs:
        run_id, attrs, tags = run["run_id"], dict(run["attrs"]), dict(run["tags"])
        figures, work = telemetry.get(run_id, {}), traced.get(run_id, {})
        count = counts[run_id]
        rows.append({
            "run_id": run_id,
            "name": run["name"],
            "status": "running" if run["end_ns"] is None else (attrs.get("status") or None),
            "exit_code": _exit_code(attrs.get("exit_code")),
            "start": run["start_ns"],
            "duration_s": (run["until_ns"] - run["start_ns"]) / 1e9,
            "gpus": count if count is not None else (len(known[run_id]) or None),
            "gpu_indices": indices_text(known[run_id]) or None,
            **{column: figures.get(column) for column in TELEMETRY_COLUMNS},
            "busy_pct": work.get("busy_pct"),
            "kernels": work.get("kernels") or 0,
            "top_kernels": top_kernels(work.get("top_names") or [], work.get("top_shares") or [], labels),
            "top_kernels_full": top_kernels(work.get("top_names") or [], work.get("top_shares") or [], {}),
            **{f"tag.{key}": tags.get(key) for key in keys},
        })  # fmt: skip
    schema = COMPARE_SCHEMA
    for key in keys:
        schema = schema.append(pa.field(f"tag.{key}", pa.string()))
    return pa.Table.from_pylist(rows, schema=schema)
