"""A job's collectives across its ranks, and the clock alignment they give: pure functions.

Matching: the n-th collective of a kind on one rank is the n-th of that kind on every other (collectives
of one process group run in the same order on every rank). A rank's collectives are those of one
family, the first it has of: NCCL kernels on a GPU; host ops `nccl:`/`gloo:`; `c10d::` ops; ranges and
phases named as collectives (so that one collective is not counted twice, as its c10d op and its gloo op).

Clock alignment. Ranks on one host share its clock. A rank of another host is put on the reference
rank's clock (the lowest rank) with the tighter of: its collectives' ends (an all-reduce ends on every
rank at nearly the same instant; the offset is the median of the reference's end less the rank's over
every collective both have, MIN_MATCHED at least, its uncertainty 1.4826 x their MAD, at least
TIME_RESOLUTION_NS); the hosts' agents' offsets to the server (the samples `agent.clock_offset_ns`, the
server's clock less the host's: the difference of the two hosts' medians, its uncertainty their spread,
or the sum of the agents' own bounds, `agent.clock_offset_uncertainty_ns`, if larger, at least
AGENT_FLOOR_NS). A rank with neither cannot be aligned: it is said, and its collectives are left
out of the skews.

Per collective (nccl-tests' definitions, as TraceLens reports them): latency, the median over ranks of
end - start; start and end skew, the spread of the ranks' aligned starts and ends; the time of the
transfer, from the last rank's arrival to the last end; algorithm bandwidth = bytes / that time, and bus
bandwidth = algorithm bandwidth x the kind's factor for n ranks (all-reduce 2(n-1)/n; all-gather,
reduce-scatter, all-to-all (n-1)/n; others 1).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from query.jobstragglers import ROBUST_SIGMA

MIN_MATCHED = 3
TIME_RESOLUTION_NS = 1_000
AGENT_FLOOR_NS = 500_000

_KINDS = (
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("all_reduce", re.compile(r"all_?reduce", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    ("all_to_all", re.compile(r"all_?to_?all", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
    ("send_recv", re.compile(r"send|recv", re.I)),
    ("reduce", re.compile(r"reduce", re.I)),
)
FAMILIES = (
    ("gpu", re.compile(r"^nccl", re.I)),
    ("backend", re.compile(r"^(nccl|gloo|mpi):", re.I)),
    ("c10d", re.compile(r"^c10d::", re.I)),
    ("named", re.compile(r"")),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in _KINDS if pattern.search(name)), "other")


def bus_factor(kind: str, ranks: int) -> float:
    if ranks < 2:
        return 1.0
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


@dataclass(frozen=True)
class Collective:
    """One collective of one rank, on its own clock."""

    kind: str
    bytes: int
    start: int
    end: int


@dataclass(frozen=True)
class Alignment:
    offset_ns: int
    uncertainty_ns: int  # -1: not aligned
    method: str  # reference, same host, collective ends, agent offsets, none
    note: str = ""


def one_family(gpu: bool, names: Sequence[str]) -> npt.NDArray[np.bool_]:
    """Which of a rank's collective-named intervals to count (see the module's docstring)."""
    for family, pattern in FAMILIES:
        if family == "gpu" and not gpu:
            continue
        mask = np.array([bool(pattern.search(name)) for name in names], bool)
        if mask.any():
            return mask
    return np.zeros(len(names), bool)


def matched(per_rank: Mapping[int, Sequence[Collective]]) -> dict[tuple[str, int], dict[int, Collective]]:
    """(kind, n) -> rank -> the rank's n-th collective of that kind."""
    found: dict[tuple[str, int], dict[int, Collective]] = defaultdict(dict)
    for rank, collectives in per_rank.items():
        seen: Counter[str] = Counter()
        for collective in sorted(collectives, key=lambda c: c.start):
            found[(collective.kind, seen[collective.kind])][rank] = collective
            seen[collective.kind] += 1
    return found


def _robust(values: npt.NDArray[np.float64]) -> tuple[int, int]:
    median = float(np.median(values))
    return round(median), round(ROBUST_SIGMA * float(np.median(np.abs(values - median))))


def align(
    hosts: Mapping[int, str],
    instances: Mapping[tuple[str, int], Mapping[int, Collective]],
    agent_offsets: Mapping[str, npt.NDArray[np.float64]],
    agent_uncertainties: Mapping[str, npt.NDArray[np.float64]] | None = None,
) -> dict[int, Alignment]:
    """Each rank's alignment to the lowest rank's clock (see the module's docstring)."""
    if not hosts:
        return {}
    reference = min(hosts)
    base = hosts[reference]
    by_host: dict[str, list[int]] = defaultdict(list)
    for rank, host in hosts.items():
        by_host[host].append(rank)
    result: dict[int, Alignment] = {}
    for host, ranks in by_host.items():
        if host == base:
            for rank in ranks:
                result[rank] = Alignment(0, 0, "reference" if rank == reference else "same host")
            continue
        choices = []
        ends = [
            instance[reference].end - instance[rank].end
            for instance in instances.values() for rank in ranks if reference in instance and rank in instance
        ]  # fmt: skip
        if len(ends) >= MIN_MATCHED:
            offset, spread = _robust(np.asarray(ends, np.float64))
            choices.append(Alignment(offset, max(spread, TIME_RESOLUTION_NS), "collective ends"))
        theirs, ours = agent_offsets.get(host), agent_offsets.get(base)
        if theirs is not None and ours is not None and theirs.size and ours.size:
            mine, my_spread = _robust(np.asarray(theirs, np.float64))
            its, its_spread = _robust(np.asarray(ours, np.float64))
            # the agents' own bounds (half their round trips) hold where a spread of a few readings may not
            measured = sum(
                float(np.median(u)) for u in ((agent_uncertainties or {}).get(h) for h in (host, base))
                if u is not None and u.size
            )  # fmt: skip
            spread = max(round(float(np.hypot(my_spread, its_spread))), round(measured), AGENT_FLOOR_NS)
            choices.append(Alignment(mine - its, spread, "agent offsets"))
        if choices:
            chosen = min(choices, key=lambda a: a.uncertainty_ns)
        else:
            chosen = Alignment(0, -1, "none", f"host {host} cannot be aligned: fewer than {MIN_MATCHED} collectives "
                               f"in common with rank {reference} and no agent clock offsets; its collectives are "
                               "left out of the skews")  # fmt: skip
        for rank in ranks:
            result[rank] = chosen
    return result


def collective_rows(
    instances: Mapping[tuple[str, int], Mapping[int, Collective]], alignment: Mapping[int, Alignment]
) -> list[dict[str, int | str | float]]:
    """Per kind and size: count, latency, skews, bandwidths and the rank that arrived last most often."""
    groups: dict[tuple[str, int], list[dict[str, float]]] = defaultdict(list)
    lasts: dict[tuple[str, int], Counter[int]] = defaultdict(Counter)
    for (kind, _), by_rank in instances.items():
        aligned = {r: c for r, c in by_rank.items() if alignment.get(r, Alignment(0, -1, "none")).uncertainty_ns >= 0}
        if len(aligned) < 2:
            continue
        size = max(c.bytes for c in aligned.values())
        starts = np.array([c.start + alignment[r].offset_ns for r, c in aligned.items()], np.int64)
        ends = np.array([c.end + alignment[r].offset_ns for r, c in aligned.items()], np.int64)
        latency = float(np.median([c.end - c.start for c in aligned.values()]))
        transfer = float(ends.max() - starts.max())
        if transfer <= 0:
            transfer = latency
        algbw = size * 1e9 / transfer if transfer > 0 else 0.0
        groups[(kind, size)].append({
            "latency": latency, "start_skew": float(starts.max() - starts.min()),
            "end_skew": float(ends.max() - ends.min()), "algbw": algbw,
            "busbw": algbw * bus_factor(kind, len(aligned)), "ranks": float(len(aligned)),
        })  # fmt: skip
        lasts[(kind, size)][list(aligned)[int(np.argmax(starts))]] += 1
    rows: list[dict[str, int | str | float]] = []
    for (kind, size), items in sorted(groups.items()):
        column = {key: np.array([item[key] for item in items]) for key in items[0]}
        last_rank, last_count = lasts[(kind, size)].most_common(1)[0]
        rows.append({
            "kind": kind, "bytes": size, "count": len(items), "ranks": int(column["ranks"].max()),
            "latency_ns": round(float(np.median(column["latency"]))),
            "arrival_skew_ns": round(float(np.median(column["start_skew"]))),
            "arrival_skew_max_ns": round(float(column["start_skew"].max())),
            "finish_skew_ns": round(float(np.median(column["end_skew"]))),
            "algbw_bytes_per_s": round(float(np.median(column["algbw"]))),
            "busbw_bytes_per_s": round(float(np.median(column["busbw"]))),
            "last_rank": last_rank, "last_rank_count": last_count,
        })  # fmt: skip
    return rows
