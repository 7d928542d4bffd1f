"""`verdict`: is group B faster than group A, by how much, how sure, and why. The store's rows
in (steps, GPU work, telemetry), three tables out: the measures with their intervals and words,
the parts of the step-time difference, and the runs with the steps each gave.

Steps are, per run: its steps (the training API's, Kineto's `ProfilerStep#N`), else its NVTX
ranges whose names match the step pattern (the outermost, on the thread with the most). Where
any run has neither, every run is cut into equal windows that cover it whole (a step of one run
beside a window of the other measures two different things; a window that leaves out part of a
run leaves out its work), and only what windows can tell is measured: GPU busy and telemetry.
Warm-up is left out per run (query/verdict_stats.py). A difference below the clock's resolution
(RESOLUTION_NS) is none."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from query.gpuwork import NS
from query.verdict_stats import (
    NO_CHANGE,
    Difference,
    Group,
    absolute_difference,
    group_of,
    relative_difference,
    warmup_steps,
)
from query.verdict_steps import (
    MAX_PARTS,
    MEMORY_PARTS,
    OTHER,
    Steps,
    Work,
    counter_rise,
    launched_by_phase,
    mean_inside,
    outermost,
    phase_parts,
    phases_inside,
    step_parts,
    windows,
)
from tracehouse.metrics import GPU_ENERGY, GPU_UTIL
from tracehouse.requesterrors import QueryError

Fetch = Callable[[str, dict[str, object]], pa.Table]  # a query's text and parameters -> its answer

# Nsight's and PyTorch's habits: ProfilerStep#12, step, train_step 12, iteration:3, Iter 7
DEFAULT_STEP_PATTERN = r"^(ProfilerStep#\d+|(?i:(train(ing)?[ _-]?)?(step|iter|iteration))([ _#:-]*\d+)?)$"
DEFAULT_WINDOW_NS = 10_000_000_000
MIN_WINDOW_NS = 1_000_000  # the shortest window a verdict takes
DEFAULT_MIN_EFFECT = 0.02
MAX_PATTERN_BYTES = 256
MAX_STEPS = 100_000  # per run: the first ones
RESOLUTION_NS = 1  # the store's clock: durations differing by less are the same
MIN_REPEATS = 3  # instances of an NVTX range that make it worth offering as steps
MAX_REPEATED_NAME = 200  # characters of a range name offered as steps
MAX_GROUP_RUNS = 100
MAX_WORK_ROWS = 5_000_000  # GPU work and API calls of every run together; past it, no parts
BATCH_KEYS = ("batch_size", "batch")  # tags or attrs that declare items per step


@dataclass(frozen=True)
class Measure:
    label: str
    unit: str
    lower_is_better: bool
    words: tuple[str, str]  # (better, worse)


MEASURES = {
    "step_time": Measure("step time", "ns", True, ("faster", "slower")),
    "throughput": Measure("throughput", "items/s", False, ("faster", "slower")),
    "gpu_busy": Measure("GPU busy", "%", False, ("busier", "less busy")),
    "energy": Measure("energy per step", "J", True, ("less energy", "more energy")),
    "gpu_util": Measure("GPU utilisation", "%", False, ("busier", "less busy")),
}


@dataclass(frozen=True)
class VerdictOptions:
    measures: tuple[str, ...] = ()  # empty: every measure the runs hold
    skip: int | None = None  # leading steps left out of each run; None: warm-up detected
    step_pattern: str = DEFAULT_STEP_PATTERN
    window_ns: int = DEFAULT_WINDOW_NS
    min_effect: float = DEFAULT_MIN_EFFECT

    def check(self) -> VerdictOptions:
        for name in self.measures:
            if name not in MEASURES:
                raise QueryError("measures", f"{name[:64]!r} is not one of {', '.join(MEASURES)}")
        if len(self.step_pattern.encode()) > MAX_PATTERN_BYTES:
            raise QueryError("step_pattern", f"longer than {MAX_PATTERN_BYTES} bytes")
        if self.window_ns < MIN_WINDOW_NS:
            raise QueryError("window_ns", "windows are at least 1 ms long")
        if not 0 < self.min_effect < 1:
            raise QueryError("min_effect", "a fraction between 0 and 1 (0.02 is 2 %)")
        if self.skip is not None and self.skip < 0:
            raise QueryError("skip", "must not be negative")
        return self


@dataclass
class RunEvidence:
    """One run's kept steps and its per-step figures."""

    run: Mapping[str, Any]
    group: str
    steps: Steps
    dropped: int
    batch: float | None
    has_steps: bool = True  # whether the run has steps of its own (windows may be used all the same)
    repeated: str | None = None  # its NVTX range of most instances, where it has no steps
    busy: np.ndarray | None = None
    parts: dict[str, np.ndarray] | None = None
    phases: dict[str, np.ndarray] | None = None
    phase_work: dict[str, np.ndarray] | None = None
    energy: np.ndarray | None = None
    util: np.ndarray | None = None


def _steps_sql() -> str:
    return f"""
SELECT run_id, kind, pid, tid, {NS}(start) AS s, {NS}(end) AS e FROM {{db}}.events
WHERE run_id IN {{run_ids:Array(String)}} AND end > start
  AND (kind = 'step' OR (kind = 'nvtx' AND match(name, {{pattern:String}})))
ORDER BY run_id, s LIMIT {MAX_STEPS * 4} BY run_id"""


def _phases_sql() -> str:
    return f"""
SELECT run_id, pid, tid, name, {NS}(start) AS s, {NS}(end) AS e FROM {{db}}.events
WHERE run_id IN {{run_ids:Array(String)}} AND kind IN ('phase', 'nvtx') AND end > start
ORDER BY run_id, s LIMIT {MAX_STEPS * 16} BY run_id"""


def _repeated_sql() -> str:
    """Per run, its NVTX range name of most instances (at least MIN_REPEATS; short enough to paste):
    what --steps could name where the run has no steps."""
    return f"""
SELECT run_id, name, count() AS n FROM {{db}}.events
WHERE run_id IN {{run_ids:Array(String)}} AND kind = 'nvtx' AND end > start AND length(name) <= {MAX_REPEATED_NAME}
GROUP BY run_id, name HAVING n >= {MIN_REPEATS}
ORDER BY run_id, n DESC, name LIMIT 1 BY run_id"""


def _top_kernels_sql() -> str:
    """The MAX_PARTS kernel names of most total time in the runs: each a part of its own."""
    return f"""
SELECT name FROM {{db}}.events
WHERE run_id IN {{run_ids:Array(String)}} AND kind = 'kernel' AND gpu >= 0 AND end > start
GROUP BY name ORDER BY sum({NS}(end) - {NS}(start)) DESC, name LIMIT {MAX_PARTS}"""


def _work_sql() -> str:
    """The runs' GPU work and API calls as numbers only: the run's index in run_ids (from 1), the
    part (0: an API call; 1..: a kernel name of `names`; then OTHER, memory copies, memory sets)."""
    other = "length({names:Array(String)}) + 1"
    return f"""
SELECT indexOf({{run_ids:Array(String)}}, run_id) AS run, gpu,
       multiIf(kind = 'cuda_api', 0, kind = 'kernel', if(indexOf({{names:Array(String)}}, name) > 0,
               indexOf({{names:Array(String)}}, name), {other}), kind = 'memcpy', {other} + 1, {other} + 2) AS part,
       {NS}(start) AS s, {NS}(end) AS e, pid, tid, ifNull({NS}(launch_start), -1) AS launch
FROM {{db}}.events
WHERE run_id IN {{run_ids:Array(String)}} AND end > start
  AND ((kind IN ('kernel', 'memcpy', 'memset') AND gpu >= 0) OR kind = 'cuda_api')
ORDER BY run, s, e, gpu, part LIMIT {MAX_WORK_ROWS + 1}"""  # in order: the same sums, to the last bit, each time


def _telemetry_sql() -> str:
    return f"""
SELECT gpu, run_id AS series, metric, {NS}(ts) AS t, value FROM {{db}}.samples
WHERE host = {{host:String}} AND gpu IN {{gpus:Array(Int16)}} AND pid = 0
  AND metric IN ('{GPU_ENERGY}', '{GPU_UTIL}') AND ts >= fromUnixTimestamp64Nano({{lo:Int64}}, 'UTC')
  AND ts < fromUnixTimestamp64Nano({{hi:Int64}}, 'UTC')
ORDER BY gpu, series, t"""


def _pick_steps(found: pa.Table, options: VerdictOptions) -> Steps | None:
    """The run's steps: step events, else pattern-matching NVTX ranges; on the thread with the most.
    None: it has neither."""
    kinds = found.column("kind").to_numpy(zero_copy_only=False) if found.num_rows else np.zeros(0, object)
    for kind, source in (("step", "steps"), ("nvtx", f"NVTX ranges matching {options.step_pattern!r}")):
        rows = found.filter(pa.array(kinds == kind)) if found.num_rows else found
        if not rows.num_rows:
            continue
        threads = np.stack([rows.column("pid").to_numpy().astype(np.uint64), rows.column("tid").to_numpy()])
        _, inverse, counts = np.unique(threads, axis=1, return_inverse=True, return_counts=True)
        mine = inverse.ravel() == np.argmax(counts)
        s, e = rows.column("s").to_numpy()[mine], rows.column("e").to_numpy()[mine]
        keep = outermost(s, e)
        pid, tid = rows.column("pid").to_numpy()[mine][0], rows.column("tid").to_numpy()[mine][0]
        return Steps(s[keep][:MAX_STEPS], e[keep][:MAX_STEPS], source, (int(pid), int(tid)))
    return None


def _windows(run: Mapping[str, Any], options: VerdictOptions) -> Steps:
    return windows(int(run["start_ns"]), int(run["until_ns"]), options.window_ns, MAX_STEPS)


def _label(run: Mapping[str, Any]) -> str:
    return str(run["name"] or run["run_id"])


def _windows_note(stepless: Sequence[str], runs: int, options: VerdictOptions) -> str:
    """Why the runs are compared in windows, and what names steps instead."""
    shown = ", ".join(repr(name[:80]) for name in stepless[:3]) + (f" and {len(stepless) - 3} more"
                                                                   if len(stepless) > 3 else "")  # fmt: skip
    which = (
        "no run has steps" if len(stepless) == runs else f"{shown} {'has' if len(stepless) == 1 else 'have'} no steps"
    )
    pattern = (
        "named like steps" if options.step_pattern == DEFAULT_STEP_PATTERN else f"matching {options.step_pattern!r}"
    )
    return (f"{which} (nor NVTX ranges {pattern}): every run is compared in windows that cover it whole, for "
            "GPU busy and telemetry only (no step time); --steps REGEX names NVTX ranges as steps, --window "
            "DURATION sets the windows' length")  # fmt: skip


def _batch(run: Mapping[str, Any]) -> float | None:
    """Items per step, where the run declares its batch size (a tag, else an attribute)."""
    for mapping in (dict(run["tags"]), dict(run["attrs"])):
        for key in BATCH_KEYS:
            try:
                value = float(mapping[key])
            except (KeyError, ValueError):
                continue
            if math.isfinite(value) and value > 0:
                return value
    return None


def gather(
    groups: Mapping[str, Sequence[Mapping[str, Any]]],
    gpus: Mapping[str, tuple[int, ...]],
    options: VerdictOptions,
    fetch: Fetch,
) -> tuple[list[RunEvidence], list[str]]:
    """Each run's kept steps and figures, and notes on what was left out. `groups`: "A"/"B" -> rows
    of compare_runs; `gpus`: each run's GPU indices (query/rungpus.py) for its telemetry."""
    runs = [(group, run) for group, members in groups.items() for run in members]
    run_ids = [run["run_id"] for _, run in runs]
    found = fetch(_steps_sql(), {"run_ids": run_ids, "pattern": options.step_pattern})
    kernels = fetch(_top_kernels_sql(), {"run_ids": run_ids}).column("name").to_pylist()
    names = [*kernels, OTHER, *MEMORY_PARTS.values()]
    found_work = fetch(_work_sql(), {"run_ids": run_ids, "names": kernels})
    notes: list[str] = []
    if found_work.num_rows > MAX_WORK_ROWS:
        notes.append(f"parts left out: the runs hold over {MAX_WORK_ROWS:,} GPU operations and API calls")
        found_work = found_work.slice(0, 0)
    work = {
        name: found_work.column(name).to_numpy() for name in ("run", "gpu", "part", "s", "e", "pid", "tid", "launch")
    }
    ranges = fetch(_phases_sql(), {"run_ids": run_ids})
    own_steps = [_pick_steps(found.filter(pc.equal(found.column("run_id"), run["run_id"])) if found.num_rows
                             else found, options) for _, run in runs]  # fmt: skip
    stepless = [_label(run) for (_, run), steps in zip(runs, own_steps, strict=True) if steps is None]
    repeated: dict[str, str] = {}
    if stepless:
        notes.append(_windows_note(stepless, len(runs), options))
        found_ranges = fetch(_repeated_sql(), {"run_ids": run_ids})
        repeated = dict(zip(found_ranges.column("run_id").to_pylist(), found_ranges.column("name").to_pylist(),
                            strict=True))  # fmt: skip
    evidence = []
    bounds = np.searchsorted(work["run"], np.arange(1, len(runs) + 2))  # work is in run order: a slice each
    for index, (group, run) in enumerate(runs):
        own_work = {name: column[bounds[index] : bounds[index + 1]] for name, column in work.items()}
        picked = own_steps[index]
        steps = picked if picked is not None and not stepless else _windows(run, options)
        dropped = min(len(steps.starts), options.skip if options.skip is not None else warmup_steps(steps.lengths))
        steps = steps.after(dropped)
        item = RunEvidence(run, group, steps, dropped, _batch(run), has_steps=picked is not None,
                           repeated=repeated.get(run["run_id"]) if picked is None else None)  # fmt: skip
        _figures(item, own_work, names)
        _phases(item, ranges, own_work)
        if not run["relative_time"] and gpus.get(run["run_id"]) and len(steps.starts):
            _telemetry(item, gpus[run["run_id"]], fetch)
        evidence.append(item)
    return evidence, notes


def _figures(item: RunEvidence, work: Mapping[str, np.ndarray], names: list[str]) -> None:
    """The parts of each step's time from the run's own GPU work and API calls (`work`)."""
    if not len(work["run"]) or not len(item.steps.starts):
        return
    api, gpu_work = work["part"] == 0, work["part"] > 0
    if not gpu_work.any():
        return
    s, e = work["s"], work["e"]
    own = Work(s[gpu_work], e[gpu_work], work["gpu"][gpu_work], work["part"][gpu_work] - 1, names, s[api], e[api])
    item.parts, item.busy = step_parts(item.steps, own)


def _phases(item: RunEvidence, ranges: pa.Table, work: Mapping[str, np.ndarray]) -> None:
    """The step's time by phase (the ranges of its thread inside it, query/verdict_steps.py), and
    the GPU time of the run's own work (`work`) launched from each."""
    if item.steps.thread is None or not ranges.num_rows or not len(item.steps.starts):
        return
    pid, tid = item.steps.thread
    mine = pc.and_(pc.equal(ranges.column("run_id"), item.run["run_id"]),
                   pc.and_(pc.equal(ranges.column("pid"), pid), pc.equal(ranges.column("tid"), tid)))  # fmt: skip
    own = ranges.filter(mine)
    names = np.array(own.column("name").to_pylist(), dtype=object)
    phases = phases_inside(item.steps, own.column("s").to_numpy(), own.column("e").to_numpy(), names)
    item.phases = phase_parts(item.steps, phases) or None
    if len(work["run"]):
        launched = (work["part"] > 0) & (work["pid"] == pid) & (work["tid"] == tid)
        launched &= work["launch"] >= 0
        order = np.argsort(work["launch"][launched], kind="stable")
        item.phase_work = launched_by_phase(item.steps, phases, work["launch"][launched][order],
                                            (work["e"] - work["s"])[launched][order]) or None  # fmt: skip


def _telemetry(item: RunEvidence, gpus: tuple[int, ...], fetch: Fetch) -> None:
    """Energy per step (the counters' rises summed over the run's GPUs, one agent's series per GPU:
    the one with the most readings) and GPU utilisation per step (the mean of the samples inside)."""
    run, steps = item.run, item.steps
    found = fetch(_telemetry_sql(), {"host": run["host"], "gpus": list(gpus), "lo": int(steps.starts[0]) - 10**9,
                                     "hi": int(steps.ends[-1]) + 10**9})  # fmt: skip
    if not found.num_rows:
        return
    gpu, series, metric = (found.column(c).to_numpy(zero_copy_only=False) for c in ("gpu", "series", "metric"))
    t, value = found.column("t").to_numpy(), found.column("value").to_numpy()
    energy = np.zeros(len(steps.starts))
    counted = False
    for one in np.unique(gpu):
        counter = (gpu == one) & (metric == GPU_ENERGY)
        if not counter.any():
            continue
        during = counter & (t >= steps.starts[0]) & (t < steps.ends[-1])
        names, counts = np.unique(series[during if during.any() else counter], return_counts=True)
        chosen = counter & (series == names[np.argmax(counts)])
        energy += counter_rise(steps, t[chosen], value[chosen])
        counted = True
    if counted:
        item.energy = energy
    util = metric == GPU_UTIL
    if util.any():
        item.util = mean_inside(steps, t[util], value[util])


# --- the answer ---------------------------------------------------------------------------------------


def _per_run(
    evidence: Sequence[RunEvidence], group: str, measure: str
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """The group's per-step values of a measure (and weights, for ratios of sums); [] when a run lacks it."""
    values, weights = [], []
    for item in (e for e in evidence if e.group == group):
        length = item.steps.lengths.astype(np.float64)
        if measure == "step_time":
            values.append(length)
        elif measure == "throughput":
            if item.batch is None:
                return [], None
            values.append(np.full(len(length), item.batch))
            weights.append(length / 1e9)
        elif measure == "gpu_busy":
            if item.busy is None:
                return [], None
            values.append(100 * item.busy)
            weights.append(length)
        else:
            series = item.energy if measure == "energy" else item.util
            if series is None:
                return [], None
            values.append(series[np.isfinite(series)])
    return values, weights if weights else None


MEASURES_SCHEMA = pa.schema([
    ("measure", pa.string()), ("unit", pa.string()), ("a", pa.float64()), ("b", pa.float64()),
    ("change", pa.float64()), ("low", pa.float64()), ("high", pa.float64()), ("verdict", pa.string()),
    ("more_runs", pa.int64()), ("runs_a", pa.int64()), ("runs_b", pa.int64()), ("steps_a", pa.int64()),
    ("steps_b", pa.int64()), ("evidence", pa.string()), ("per", pa.string()),
])  # fmt: skip
PARTS_SCHEMA = pa.schema([
    ("part", pa.string()), ("a_ns", pa.float64()), ("b_ns", pa.float64()), ("delta_ns", pa.float64()),
    ("low_ns", pa.float64()), ("high_ns", pa.float64()),
])  # fmt: skip
RUNS_SCHEMA = pa.schema([
    ("group", pa.string()), ("run_id", pa.string()), ("name", pa.string()), ("steps_from", pa.string()),
    ("warmup_dropped", pa.int64()), ("steps", pa.int64()), ("mean_step_ns", pa.float64()),
    ("batch", pa.float64()), ("span_ns", pa.int64()), ("has_steps", pa.bool_()), ("gpu_work", pa.bool_()),
    ("repeated_range", pa.string()),
])  # fmt: skip


def measures_table(evidence: Sequence[RunEvidence], options: VerdictOptions) -> pa.Table:
    """One row per measure: A's and B's figures, B's relative change with its interval, the word;
    throughput first when the runs' batch sizes differ (the step then does different work)."""
    rows = []
    wanted = options.measures or tuple(MEASURES)
    batches = {item.group: item.batch for item in evidence}
    if "throughput" in wanted and len(set(batches.values())) > 1:  # per step means less when steps differ
        wanted = ("throughput", *(name for name in wanted if name != "throughput"))
    windowed = any(item.steps.windows for item in evidence)
    for name in wanted:
        found = {group: _per_run(evidence, group, name) for group in ("A", "B")}
        counts = {group: sum(len(v) for v in values) for group, (values, _) in found.items()}
        # windows of one length: their time and items per window say nothing of the run
        per = "window" if windowed else "step"
        if not all(counts.values()) or (windowed and name in ("step_time", "throughput")):
            if options.measures:
                rows.append({"measure": name, "unit": MEASURES[name].unit, "verdict": "not measured", "per": per})
            continue
        a, b = (group_of(*found[group]) for group in ("A", "B"))
        steps_a, steps_b = counts["A"], counts["B"]
        measure = MEASURES[name]
        diff = relative_difference(a, b, options.min_effect, measure.words, measure.lower_is_better)
        if measure.unit == "ns" and abs(diff.b - diff.a) < RESOLUTION_NS:  # float noise, not a difference
            diff = replace(diff, change=0.0, word=NO_CHANGE if diff.low is not None else diff.word)
        rows.append({**_measure_row(name, measure, diff, a, b, steps_a, steps_b), "per": per})
    return pa.Table.from_pylist(rows, schema=MEASURES_SCHEMA)


def _measure_row(name: str, measure: Measure, diff: Difference, a: Group, b: Group, steps_a: int,
                 steps_b: int) -> dict[str, Any]:  # fmt: skip
    units = "runs" if a.runs > 1 and b.runs > 1 else "batches of steps (one run: run-to-run spread not measured)"
    return {
        "measure": name, "unit": measure.unit, "a": diff.a, "b": diff.b, "change": diff.change, "low": diff.low,
        "high": diff.high, "verdict": diff.word, "more_runs": diff.more_runs, "runs_a": a.runs, "runs_b": b.runs,
        "steps_a": steps_a, "steps_b": steps_b, "evidence": units,
    }  # fmt: skip


def parts_table(evidence: Sequence[RunEvidence], by: str = "parts") -> pa.Table:
    """The step-time difference in parts that add up to it (ns per step, B - A, with intervals),
    largest |difference| first: `by` "parts" (kernels, memory operations, GPU idle; empty unless
    every run has GPU work inside its steps) or "phases" (empty unless every run has phases); or
    "phase_work", the GPU time launched from each phase (which adds up to no step time). Windows
    have no parts."""
    split = {id(item): getattr(item, by) for item in evidence}
    # a window's time is no step's: windows of two runs differ in length, and their parts with them
    if not evidence or any(found is None for found in split.values()) or any(e.steps.windows for e in evidence):
        return PARTS_SCHEMA.empty_table()
    names = sorted({name for found in split.values() for name in found or {}})
    rows: list[dict[str, Any]] = []
    for name in names:
        sides = []
        for group in ("A", "B"):
            members = [item for item in evidence if item.group == group]
            values = [(split[id(item)] or {}).get(name, np.zeros(len(item.steps.starts))) for item in members]
            sides.append(group_of(values))
        delta, low, high = absolute_difference(*sides)
        delta = 0.0 if abs(delta) < RESOLUTION_NS else delta  # below the clock: none
        rows.append({"part": name, "a_ns": sides[0].estimate, "b_ns": sides[1].estimate, "delta_ns": delta,
                     "low_ns": low, "high_ns": high})  # fmt: skip
    rows.sort(key=lambda row: (-abs(row["delta_ns"]), row["part"]))
    return pa.Table.from_pylist(rows, schema=PARTS_SCHEMA)


def runs_table(evidence: Sequence[RunEvidence]) -> pa.Table:
    return pa.Table.from_pylist([
        {"group": item.group, "run_id": item.run["run_id"], "name": item.run["name"], "steps_from": item.steps.source,
         "warmup_dropped": item.dropped, "steps": len(item.steps.starts),
         "mean_step_ns": float(item.steps.lengths.mean()) if len(item.steps.starts) else None, "batch": item.batch,
         "span_ns": max(0, int(item.run["until_ns"]) - int(item.run["start_ns"])), "has_steps": item.has_steps,
         "gpu_work": item.busy is not None, "repeated_range": item.repeated}
        for item in evidence
    ], schema=RUNS_SCHEMA)  # fmt: skip
