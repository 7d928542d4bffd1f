"""The job view: a job's ranks, stragglers (and why), collectives and, when asked, its steps per rank,
answered from what query/jobassemble.py stored (assembled first where the job is new or changed).

Steps every rank has are compared (query/jobstragglers.py); a rank lacking steps others have, or with
none, is said. Telemetry of a straggler: its GPU's samples over the wall-clock span of its slow steps,
beside the median of its peers' GPUs (at most MAX_PEERS of them, spread over the ranks) over that span.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from query import jobassemble, jobstragglers
from query.jobparts import PARTS
from tracehouse.metrics import (
    GPU_PCIE_RX,
    GPU_PCIE_TX,
    GPU_POWER,
    GPU_SM_CLOCK,
    GPU_TEMP,
    GPU_THROTTLE,
    GPU_UTIL,
)
from tracehouse.requesterrors import QueryError, RunNotFound

MAX_PEERS = 64
TELEMETRY_TOLD = 5  # stragglers whose telemetry is read, the costliest first
MAX_STEP_PATTERN = 1024
TELEMETRY = (GPU_SM_CLOCK, GPU_POWER, GPU_TEMP, GPU_THROTTLE, GPU_UTIL, GPU_PCIE_TX, GPU_PCIE_RX)
# NVML's clock-event (throttle) reasons, as the bits of gpu.throttle_reasons
THROTTLE_BITS = {
    0x1: "idle", 0x2: "application clocks", 0x4: "software power cap", 0x8: "hardware slowdown",
    0x10: "sync boost", 0x20: "software thermal", 0x40: "hardware thermal", 0x80: "hardware power brake",
    0x100: "display clocks",
}  # fmt: skip

RANKS_SQL = """
SELECT rank, run_id, host, gpu, world_size, local_rank, steps, offset_ns, uncertainty_ns, alignment, note
FROM {db}.jobs WHERE job = {job:String} AND generation = {generation:String} ORDER BY rank"""
STEPS_SQL = """
SELECT rank, step, toUnixTimestamp64Nano(start) AS start_ns, dur_ns, compute_ns, comm_ns, data_ns, idle_ns
FROM {db}.job_steps WHERE job = {job:String} AND generation = {generation:String}"""
COLLECTIVES_SQL = """
SELECT * EXCEPT (job, generation) FROM {db}.job_collectives
WHERE job = {job:String} AND generation = {generation:String} ORDER BY kind, bytes"""
TELEMETRY_SQL = f"""
SELECT host, gpu, metric, avg(value) AS mean, min(value) AS low, max(value) AS high,
       groupBitOr(toUInt64(value)) AS bits, count() AS samples
FROM {{db}}.samples
WHERE metric IN {TELEMETRY!r} AND (host, gpu) IN {{gpus:Array(Tuple(String, Int16))}}
  AND ts >= fromUnixTimestamp64Nano({{lo:Int64}}) AND ts < fromUnixTimestamp64Nano({{hi:Int64}})
GROUP BY host, gpu, metric"""
PROCESSES_SQL = """
SELECT host, gpu, uniqExact(pid) AS processes FROM {db}.samples
WHERE metric LIKE 'proc.%' AND pid != 0 AND (host, gpu) IN {gpus:Array(Tuple(String, Int16))}
  AND ts >= fromUnixTimestamp64Nano({lo:Int64}) AND ts < fromUnixTimestamp64Nano({hi:Int64})
GROUP BY host, gpu"""


@dataclass
class JobAnswer:
    generation: str
    ranks: pa.Table
    stragglers: pa.Table
    telemetry: pa.Table
    collectives: pa.Table
    steps: pa.Table | None
    notes: list[str] = field(default_factory=list)


def step_filter(pattern: str) -> Callable[[np.ndarray], np.ndarray]:
    """Steps whose number, as decimal text, the regular expression finds (Python's re)."""
    if len(pattern) > MAX_STEP_PATTERN:
        raise QueryError("step_pattern", f"longer than {MAX_STEP_PATTERN} characters")
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise QueryError("step_pattern", f"not a regular expression: {error}") from None
    return lambda steps: np.array([bool(compiled.search(str(s))) for s in steps.tolist()], bool)


def _rows_of(step_col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the step numbers present, each row's index among them): by counting where their span is small."""
    if not step_col.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    low, high = int(step_col.min()), int(step_col.max())
    if high - low > 4 * step_col.size:
        return np.unique(step_col, return_inverse=True)
    present = np.zeros(high - low + 1, bool)
    present[step_col - low] = True
    index = np.cumsum(present) - 1
    return np.flatnonzero(present) + low, index[step_col - low]


def _matrix(steps: pa.Table, rank_ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(step numbers, {column: steps x ranks float matrix, NaN where a rank lacks the step})."""
    numbers, row = _rows_of(steps.column("step").to_numpy())
    col = np.searchsorted(rank_ids, steps.column("rank").to_numpy().astype(np.int64))
    out = {}
    for name in ("dur_ns", *PARTS):
        grid = np.full((numbers.size, rank_ids.size), np.nan)
        grid[row, col] = steps.column(name).to_numpy()
        out[name] = grid
    return numbers, out


def _rank_rows(ranks: Sequence[Mapping[str, Any]], grids: Mapping[str, np.ndarray], rank_ids: np.ndarray,
               slow: np.ndarray) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rank with no steps: NaN, shown as 0
        by_column = {name: np.nanmean(grids[name], axis=0) for name in ("dur_ns", *PARTS)}
    for row in ranks:
        i = int(np.searchsorted(rank_ids, row["rank"]))
        have = i < rank_ids.size and rank_ids[i] == row["rank"]
        medians = {
            f"mean_{name}": int(by_column[name][i]) if have and np.isfinite(by_column[name][i]) else 0
            for name in ("dur_ns", *PARTS)
        }  # fmt: skip
        rows.append({**{k: row[k] for k in ("rank", "run_id", "host", "gpu", "steps")}, **medians,
                     "slow_steps": int(slow[:, i].sum()) if have else 0,
                     **{k: row[k] for k in ("offset_ns", "uncertainty_ns", "alignment", "note")}})  # fmt: skip
    return rows


def throttle_text(bits: int) -> str:
    return ", ".join(name for bit, name in THROTTLE_BITS.items() if bits & bit and bit != 0x1) or "none"


def _telemetry(query: jobassemble.Query, straggler: jobstragglers.Straggler, by_rank: Mapping[int, Mapping[str, Any]],
               span: tuple[int, int]) -> list[dict[str, Any]]:  # fmt: skip
    """The straggler's GPU next to its peers' (their median) over `span`, one row per metric."""
    mine = by_rank[straggler.rank]
    if mine["gpu"] < 0:
        return []
    peers = [r for rank, r in sorted(by_rank.items()) if rank != straggler.rank and r["gpu"] >= 0]
    if len(peers) > MAX_PEERS:
        peers = [peers[i] for i in np.linspace(0, len(peers) - 1, MAX_PEERS).astype(int)]
    gpus = [(mine["host"], mine["gpu"]), *((p["host"], p["gpu"]) for p in peers)]
    params = {"gpus": gpus, "lo": span[0], "hi": span[1]}
    found = query(TELEMETRY_SQL, params).to_pylist()
    processes = {(r["host"], r["gpu"]): r["processes"] for r in query(PROCESSES_SQL, params).to_pylist()}
    rows = []
    for metric in TELEMETRY:
        of = {(r["host"], r["gpu"]): r for r in found if r["metric"] == metric}
        own = of.get((mine["host"], mine["gpu"]))
        theirs = [of[(p["host"], p["gpu"])] for p in peers if (p["host"], p["gpu"]) in of]
        if own is None and not theirs:
            continue
        row = {"rank": straggler.rank, "first_step": straggler.first_step, "metric": metric,
               "rank_mean": None if own is None else own["mean"],
               "peers_mean": float(np.median([t["mean"] for t in theirs])) if theirs else None,
               "rank_low": None if own is None else own["low"], "peers": len(theirs), "detail": ""}  # fmt: skip
        if metric == GPU_THROTTLE:
            bits = own["bits"] if own else 0
            peer_bits = int(np.bitwise_or.reduce([t["bits"] for t in theirs])) if theirs else 0
            row["detail"] = f"{throttle_text(bits)} (peers: {throttle_text(peer_bits)})"
        rows.append(row)
    own_processes = processes.get((mine["host"], mine["gpu"]), 0)
    peer_processes = [processes.get((p["host"], p["gpu"]), 0) for p in peers]
    if own_processes or any(peer_processes):
        rows.append({"rank": straggler.rank, "first_step": straggler.first_step, "metric": "processes",
                     "rank_mean": float(own_processes), "peers_mean": float(np.median(peer_processes or [0])),
                     "rank_low": float(own_processes), "peers": len(peers),
                     "detail": "processes seen on the GPU"})  # fmt: skip
    return rows


def _said_missing(numbers: np.ndarray, dur: np.ndarray, rank_ids: np.ndarray) -> list[str]:
    notes = []
    lacking = np.isnan(dur)
    for i in np.flatnonzero(lacking.any(axis=0) & ~lacking.all(axis=0)):
        missing = numbers[lacking[:, i]]
        shown = ", ".join(map(str, missing[:10].tolist())) + (" …" if missing.size > 10 else "")
        notes.append(f"rank {int(rank_ids[i])} lacks {missing.size} of {numbers.size} steps ({shown}): "
                     "those steps are left out of the stragglers")  # fmt: skip
    return notes


STRAGGLER_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("first_step", pa.int64()), ("last_step", pa.int64()), ("slow_steps", pa.int64()),
    ("lost_ns", pa.int64()), ("job_ns", pa.int64()), ("excess_ns", pa.int64()), ("cause", pa.string()),
    ("compute_growth_ns", pa.int64()), ("data_growth_ns", pa.int64()), ("idle_growth_ns", pa.int64()),
])  # fmt: skip
TELEMETRY_SCHEMA = pa.schema([
    ("rank", pa.int64()), ("first_step", pa.int64()), ("metric", pa.string()), ("rank_mean", pa.float64()),
    ("peers_mean", pa.float64()), ("rank_low", pa.float64()), ("peers", pa.int64()), ("detail", pa.string()),
])  # fmt: skip


def job_view(query: jobassemble.Query, append: Callable[[str, pa.Table], None], job: str, step_pattern: str = "",
             step_rows: bool = False, forget: Callable[[str, dict[str, Any]], None] | None = None,
             ) -> JobAnswer:  # fmt: skip
    """The job view of `job` (see the module's docstring); RunNotFound when no run names it. `forget`:
    deletes the job's rows of older generations (jobassemble.ensure_assembled)."""
    keep = step_filter(step_pattern) if step_pattern else None
    generation, runs = jobassemble.ensure_assembled(query, append, job, forget)
    if not runs:
        raise RunNotFound(f"no run names the job {job!r} (runs name it with --job, job=, or the launcher's variables)")
    params = {"job": job, "generation": generation}
    stored = query(RANKS_SQL, params).to_pylist()
    notes = [r["note"] for r in stored if r["rank"] == jobassemble.NOTE_RANK]
    ranks = [r for r in stored if r["rank"] != jobassemble.NOTE_RANK]
    notes += [f"rank {r['rank']} ({r['run_id']}): {r['note']}" for r in ranks if r["note"]]
    steps = query(STEPS_SQL, params)
    if keep is not None and steps.num_rows:
        steps = steps.filter(pa.array(keep(steps.column("step").to_numpy())))
    rank_ids = np.array(sorted({r["rank"] for r in ranks}), np.int64)
    numbers, grids = _matrix(steps, rank_ids)
    notes += _said_missing(numbers, grids["dur_ns"], rank_ids)
    stepped = ~np.isnan(grids["dur_ns"]).all(axis=0)
    complete = ~np.isnan(grids["dur_ns"][:, stepped]).any(axis=1)
    whole = complete.all() and stepped.all()  # no copies then: 2 M cells a grid at 1,024 x 2,000
    sub = grids if whole else {name: grid[np.ix_(complete, stepped)] for name, grid in grids.items()}
    found: list[jobstragglers.Straggler] = []
    slow = np.zeros(grids["dur_ns"].shape, bool)
    if int(stepped.sum()) < 2:
        notes.append(f"a job of {int(stepped.sum())} rank(s) with steps: no peers to compare, so no stragglers")
    elif complete.any():
        over = jobstragglers.slow_mask(sub["dur_ns"] - sub["comm_ns"])
        found = jobstragglers.stragglers(numbers[complete], rank_ids[stepped], sub["dur_ns"], sub, over)
        slow[np.ix_(complete, stepped)] = np.nan_to_num(over, nan=-1.0) > 0
    by_rank = {r["rank"]: r for r in ranks}
    telemetry = []
    step_col = steps.column("step").to_numpy()
    for straggler in found[:TELEMETRY_TOLD]:
        inside = (step_col >= straggler.first_step) & (step_col <= straggler.last_step)
        starts = steps.column("start_ns").to_numpy()[inside]
        span = (int(starts.min()), int((starts + steps.column("dur_ns").to_numpy()[inside]).max()))
        telemetry += _telemetry(query, straggler, by_rank, span)
    straggler_rows = [{
        "rank": s.rank, "first_step": s.first_step, "last_step": s.last_step, "slow_steps": s.slow_steps,
        "lost_ns": s.lost_ns, "job_ns": s.job_ns, "excess_ns": s.excess_ns, "cause": s.cause,
        **{f"{part.removesuffix('_ns')}_growth_ns": value for part, value in s.growth_ns.items()},
    } for s in found]  # fmt: skip
    step_table = None
    if step_rows:
        step_table = steps.sort_by([("rank", "ascending"), ("step", "ascending")])
    return JobAnswer(
        generation=generation, ranks=pa.Table.from_pylist(_rank_rows(ranks, grids, rank_ids, slow)),
        stragglers=pa.Table.from_pylist(straggler_rows, STRAGGLER_SCHEMA),
        telemetry=pa.Table.from_pylist(telemetry, TELEMETRY_SCHEMA), collectives=query(COLLECTIVES_SQL, params),
        steps=step_table, notes=notes,
    )  # fmt: skip
