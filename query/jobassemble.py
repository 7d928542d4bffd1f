"""A job made from its ranks' runs: which run is which rank (and what was done about bad input), each
rank's steps in parts (query/jobparts.py), and the ranks' clock alignment (query/jobcollectives.py),
stored in `jobs` and `job_steps` under a generation: the fingerprint of the runs and their steps. A job
is assembled when it is first asked about, and again once a run of it changed or got steps; the
latest generation answers. One server assembles a job once at a time (a lock per job)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from query import jobcollectives as jc
from query.jobparts import COLLECTIVE, GPU_KINDS, HOST_KINDS, Intervals, classify, step_parts
from tracehouse.jobs import membership_of
from tracehouse.metrics import AGENT_SERVER_OFFSET, AGENT_SERVER_OFFSET_UNCERTAINTY
from tracehouse.units import NS_PER_S

Query = Callable[[str, dict[str, Any]], pa.Table]
MAX_RANKS = 16_384
NOTE_RANK = (1 << 32) - 1  # the jobs row that holds a note of the job's own
MAX_EVENTS_PER_RANK = 20_000_000
_LOCKS: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)

RUNS_SQL = """
SELECT run_id, host, attrs, toUnixTimestamp64Nano(start) AS start_ns, toUnixTimestamp64Nano(updated) AS updated_ns,
       end IS NULL AS open
FROM {db}.runs FINAL WHERE attrs['job'] = {job:String} AND NOT importing
ORDER BY start, run_id LIMIT {limit:UInt32}"""
STEP_COUNTS_SQL = """
SELECT run_id, count() AS n, toUnixTimestamp64Nano(max(end)) AS last
FROM {db}.events WHERE run_id IN {runs:Array(String)} AND kind = 'step' GROUP BY run_id"""
GENERATION_SQL = "SELECT count() AS n FROM {db}.jobs WHERE job = {job:String} AND generation = {generation:String}"
# the ranks' events, a batch of runs at once: the events' sort key is not the run, so each query scans the
# hosts' events of these kinds whatever runs it asks for; each run's rows at most MAX_EVENTS_PER_RANK
EVENTS_SQL = f"""
SELECT run_id, kind, name, toUnixTimestamp64Nano(start) AS s, toUnixTimestamp64Nano(end) AS e, depth, gpu, bytes,
       toInt64OrNull(extras['step']) AS step
FROM {{db}}.events
WHERE run_id IN {{runs:Array(String)}} AND (kind = 'step' OR kind IN {tuple(sorted(GPU_KINDS))}
      OR (kind IN {tuple(sorted(HOST_KINDS))} AND depth <= 2))
ORDER BY run_id, start LIMIT {MAX_EVENTS_PER_RANK} BY run_id"""
BATCH_RANKS = 128
OFFSETS_MARGIN_NS = 600 * NS_PER_S  # agent offsets read this far before the first start and after the last step
OFFSETS_SQL = f"""
SELECT host, groupArrayIf(value, metric = '{AGENT_SERVER_OFFSET}') AS offsets,
       groupArrayIf(value, metric = '{AGENT_SERVER_OFFSET_UNCERTAINTY}') AS uncertainties FROM {{db}}.samples
WHERE metric IN ('{AGENT_SERVER_OFFSET}', '{AGENT_SERVER_OFFSET_UNCERTAINTY}') AND host IN {{hosts:Array(String)}}
  AND ts >= fromUnixTimestamp64Nano({{lo:Int64}}) AND ts < fromUnixTimestamp64Nano({{hi:Int64}})
GROUP BY host"""


@dataclass(frozen=True)
class Rank:
    rank: int
    run_id: str
    host: str
    world_size: int
    local_rank: int


def choose_ranks(runs: Sequence[Mapping[str, Any]], steps: Mapping[str, int]) -> tuple[list[Rank], list[str]]:
    """The rank each run is, one run a rank, and notes on what was done about the rest: runs of no rank
    (launchers), duplicate ranks (the run with the most steps kept), ranks disagreeing on the world size."""
    notes: list[str] = []
    claims: defaultdict[int, list[Rank]] = defaultdict(list)
    for run in runs:
        member = membership_of(dict(run["attrs"]))
        if member is None:
            continue
        if member.rank is None:
            notes.append(f"run {run['run_id']} names the job but no rank (a launcher?): left out")
            continue
        claims[member.rank].append(Rank(member.rank, run["run_id"], run["host"], member.world_size or 0,
                                        -1 if member.local_rank is None else member.local_rank))  # fmt: skip
    ranks = []
    for rank, claimants in sorted(claims.items()):
        kept = max(claimants, key=lambda r: steps.get(r.run_id, 0))  # the first of equals: the earliest started
        ranks.append(kept)
        if len(claimants) > 1:
            others = ", ".join(r.run_id for r in claimants if r is not kept)
            notes.append(f"rank {rank} is claimed by {len(claimants)} runs: kept {kept.run_id} "
                         f"({steps.get(kept.run_id, 0)} steps), left out {others}")  # fmt: skip
    worlds = Counter(r.world_size for claimants in claims.values() for r in claimants if r.world_size)
    if len(worlds) > 1:
        said = "; ".join(f"{n} rank(s) say {w}" for w, n in worlds.most_common())
        notes.append(f"the ranks disagree on the world size ({said}): took {max(worlds)}, the largest")
    world = max(worlds) if worlds else len(ranks)
    missing = sorted(set(range(world)) - {r.rank for r in ranks})
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
        notes.append(f"{len(missing)} rank(s) of {world} have no run: {shown}")
    beyond = [r.rank for r in ranks if r.rank >= world]
    if beyond:
        notes.append(f"rank(s) {', '.join(map(str, beyond[:20]))} past the world size {world}: kept")
    return ranks, notes


def fingerprint(runs: Sequence[Mapping[str, Any]], steps: Mapping[str, tuple[int, int]]) -> str:
    text = "\n".join(
        f"{run['run_id']}/{run['updated_ns']}/{steps.get(run['run_id'], (0, 0))}"
        for run in sorted(runs, key=lambda r: r["run_id"])
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def job_runs(query: Query, job: str) -> tuple[list[dict[str, Any]], dict[str, tuple[int, int]]]:
    runs = query(RUNS_SQL, {"job": job, "limit": MAX_RANKS * 2}).to_pylist()
    for run in runs:
        run["attrs"] = dict(run["attrs"])
    counts = query(STEP_COUNTS_SQL, {"runs": [r["run_id"] for r in runs]}).to_pylist() if runs else []
    return runs, {row["run_id"]: (row["n"], row["last"] or 0) for row in counts}


@dataclass
class RankData:
    """What one rank's run holds, read once: steps, their parts, its collectives and its GPU."""

    steps: pa.Table
    collectives: list[jc.Collective]
    gpu: int


def read_ranks(query: Query, ranks: Sequence[Rank]) -> dict[int, RankData]:
    """Each rank's data, its run's events read BATCH_RANKS runs a query."""
    found = {}
    for at in range(0, len(ranks), BATCH_RANKS):
        batch = ranks[at : at + BATCH_RANKS]
        table = query(EVENTS_SQL, {"runs": [rank.run_id for rank in batch]})
        run_ids = table.column("run_id").cast(pa.string())
        for rank in batch:
            found[rank.rank] = rank_data(table.filter(pc.equal(run_ids, rank.run_id)), rank)
    return found


def rank_data(table: pa.Table, rank: Rank) -> RankData:
    """What `table`, the rank's events in the order they start, says of its steps, collectives and GPU."""
    kinds, names = table.column("kind").to_pylist(), table.column("name").to_pylist()
    start, end = table.column("s").to_numpy(), table.column("e").to_numpy()
    depth = table.column("depth").to_numpy()
    is_step = np.array([k == "step" for k in kinds], bool)
    step_numbers = table.column("step").to_numpy(zero_copy_only=False)
    others = ~is_step
    classes, on_gpu = classify([k for k, s in zip(kinds, is_step, strict=True) if not s],
                               [n for n, s in zip(names, is_step, strict=True) if not s], depth[others])  # fmt: skip
    o_start, o_end = start[others], end[others]

    def of(name: str) -> Intervals:
        mask = classes == name
        return Intervals(o_start[mask], o_end[mask])

    numbers = np.asarray(step_numbers[is_step], np.float64)
    keep = ~np.isnan(numbers)
    s_number, s_start, s_end = numbers[keep].astype(np.int64), start[is_step][keep], end[is_step][keep]
    s_number, first = np.unique(s_number, return_index=True)  # a step recorded twice (two threads): the first
    s_start, s_end = s_start[first], s_end[first]
    parts = step_parts(s_start, s_end, of("compute"), of("comm"), of("data"))
    steps = pa.table(
        {
            "rank": np.full(s_number.size, rank.rank, np.uint32),
            "step": s_number,
            "start": pa.array(s_start, pa.timestamp("ns", "UTC")),
            "dur_ns": s_end - s_start,
            **parts,
        }
    )
    comm_at = np.flatnonzero(classes == "comm")
    comm_names = list(np.asarray(names, dtype=object)[others][comm_at])
    family = jc.one_family(on_gpu, comm_names)
    o_bytes = table.column("bytes").to_numpy()[others]
    collectives = [
        jc.Collective(jc.kind_of(comm_names[i]), int(o_bytes[at]), int(o_start[at]), int(o_end[at]))
        for i, at in enumerate(comm_at) if family[i] and COLLECTIVE.search(comm_names[i])
    ]  # fmt: skip
    gpus = table.column("gpu").to_numpy()[others][classes == "compute"]
    gpus = gpus[gpus >= 0]
    gpu = int(np.bincount(gpus).argmax()) if gpus.size else (rank.local_rank if on_gpu or rank.local_rank >= 0 else -1)
    return RankData(steps, collectives, gpu)


def agent_offsets(
    query: Query, hosts: Sequence[str], lo: int, hi: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each host's agent's offsets to the server, and the uncertainties the agent measured with them."""
    rows = query(OFFSETS_SQL, {"hosts": list(hosts), "lo": lo, "hi": hi}).to_pylist()
    return (
        {row["host"]: np.asarray(row["offsets"], np.float64) for row in rows},
        {row["host"]: np.asarray(row["uncertainties"], np.float64) for row in rows},
    )


def assemble(
    query: Query, append: Callable[[str, pa.Table], None], job: str, runs: Sequence[Mapping[str, Any]],
    steps: Mapping[str, tuple[int, int]], generation: str,
) -> None:  # fmt: skip
    """Read every rank's run and store the job's ranks and steps under `generation`."""
    ranks, notes = choose_ranks(runs, {k: v[0] for k, v in steps.items()})
    data = read_ranks(query, ranks)
    hosts = {rank.rank: rank.host for rank in ranks}
    starts = [r["start_ns"] for r in runs]
    offsets, uncertainties = agent_offsets(query, sorted(set(hosts.values())), min(starts) - OFFSETS_MARGIN_NS,
                            max(s for s in (*starts, *(v[1] for v in steps.values()))) + OFFSETS_MARGIN_NS)  # fmt: skip
    instances = jc.matched({rank: d.collectives for rank, d in data.items()})
    alignment = jc.align(hosts, instances, offsets, uncertainties)
    now = time.time_ns()
    rows = []
    for rank in ranks:
        d, a = data[rank.rank], alignment[rank.rank]
        note = a.note or ("" if d.steps.num_rows else "no steps (no trace, or a trace without steps): left out")
        rows.append({"job": job, "generation": generation, "rank": rank.rank, "run_id": rank.run_id,
                     "host": rank.host, "gpu": d.gpu, "world_size": rank.world_size, "local_rank": rank.local_rank,
                     "steps": d.steps.num_rows, "offset_ns": a.offset_ns, "uncertainty_ns": a.uncertainty_ns,
                     "alignment": a.method, "note": note, "assembled": now})  # fmt: skip
    for note in notes:  # the job's own notes, as a row of no rank
        rows.append({"job": job, "generation": generation, "rank": NOTE_RANK, "run_id": "", "host": "",
                     "gpu": -1, "world_size": 0, "local_rank": -1, "steps": 0, "offset_ns": 0,
                     "uncertainty_ns": -1, "alignment": "none", "note": note, "assembled": now})  # fmt: skip
    tables = [d.steps for d in data.values() if d.steps.num_rows]
    if tables:
        all_steps = pa.concat_tables(tables)
        n = all_steps.num_rows
        all_steps = all_steps.append_column("job", pa.array([job] * n)).append_column(
            "generation", pa.array([generation] * n)
        )
        append("job_steps", all_steps)
    collectives = jc.collective_rows(instances, alignment)
    if collectives:
        append("job_collectives", pa.Table.from_pylist([{"job": job, "generation": generation, **row}
                                                         for row in collectives]))  # fmt: skip
    jobs = pa.Table.from_pylist(rows)
    jobs = jobs.set_column(
        jobs.column_names.index("assembled"), "assembled", jobs.column("assembled").cast(pa.timestamp("ns", "UTC"))
    )
    append("jobs", jobs)  # last: its rows say the generation is whole


def forget_others(job: str, generation: str) -> list[tuple[str, dict[str, Any]]]:
    """DELETEs of the job's rows of other generations than `generation` (never read again): only where one
    process assembles (on a shared store another could be assembling them now)."""
    return [(f"DELETE FROM {{db}}.{table} WHERE job = {{job:String}} AND generation != {{generation:String}}",
             {"job": job, "generation": generation}) for table in ("job_steps", "job_collectives", "jobs")]  # fmt: skip


def ensure_assembled(
    query: Query,
    append: Callable[[str, pa.Table], None],
    job: str,
    forget: Callable[[str, dict[str, Any]], None] | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """The job's generation, assembled now if it is new; and its runs (empty: no run names the job).
    `forget`: runs forget_others' statements once a new generation is whole."""
    runs, steps = job_runs(query, job)
    if not runs:
        return "", runs
    generation = fingerprint(runs, steps)
    with _LOCKS[job]:
        if not query(GENERATION_SQL, {"job": job, "generation": generation}).column("n")[0].as_py():
            assemble(query, append, job, runs, steps, generation)
            if forget is not None:
                for statement in forget_others(job, generation):
                    forget(*statement)
    return generation, runs
