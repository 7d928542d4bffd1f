"""A rank's steps in parts, from its intervals: pure functions over numpy arrays.

Each interval of a rank's run is of one class, by its kind and name:

- comm: a collective — GPU work named as NCCL names its kernels (`ncclDevKernel_AllReduce…`,
  `ncclKernel_…`), or, on a rank with no GPU work, a host op or range named as c10d, gloo or MPI name
  theirs (`c10d::allreduce_`, `gloo:all_reduce`, a phase `allreduce`);
- data: a range or op of data loading (`enumerate(DataLoader)…`, a phase `data`, `dataloader`, `load…`);
- compute: any other GPU work (kernels, memcpy, memset); on a rank with no GPU work, its host ops and
  phases (depth 0: nested ones are inside them).

A step's time is then split, in this order of precedence, so that the parts add up to it:
compute = the time some compute runs; comm (exposed communication) = the time in a collective with no
compute running; data = the time in data loading with neither; idle = the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

COLLECTIVE = re.compile(
    r"nccl|gloo|c10d::|mpi_|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|barrier", re.IGNORECASE
)
DATA = re.compile(r"dataloader|data_?load|^data\b|^load|next_?batch|enumerate\(", re.IGNORECASE)
GPU_KINDS = frozenset({"kernel", "memcpy", "memset"})
HOST_KINDS = frozenset({"cpu_op", "phase", "nvtx", "python"})
PARTS = ("compute_ns", "comm_ns", "data_ns", "idle_ns")


@dataclass(frozen=True)
class Intervals:
    """A rank's intervals of one class: starts and ends, ns."""

    start: I64
    end: I64

    @classmethod
    def empty(cls) -> Intervals:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))

    def __or__(self, other: Intervals) -> Intervals:
        return Intervals(np.concatenate([self.start, other.start]), np.concatenate([self.end, other.end]))


def union(intervals: Intervals) -> Intervals:
    """The disjoint, sorted union of the intervals."""
    keep = intervals.end > intervals.start
    start, end = intervals.start[keep], intervals.end[keep]
    if not start.size:
        return Intervals.empty()
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    new = np.ones(start.size, bool)
    new[1:] = start[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    tails = np.append(heads[1:], start.size) - 1
    return Intervals(start[heads], reach[tails])


def covered(intervals: Intervals, start: I64, end: I64) -> I64:
    """For each window [start, end), how long the intervals cover of it."""
    merged = union(intervals)
    if not merged.start.size:
        return np.zeros(start.size, np.int64)
    before = np.concatenate([[0], np.cumsum(merged.end - merged.start)])

    def upto(t: I64) -> I64:
        i = np.searchsorted(merged.start, t, side="right")  # intervals starting at or before t
        last = np.maximum(i - 1, 0)
        inside = np.where(i > 0, np.clip(t - merged.start[last], 0, merged.end[last] - merged.start[last]), 0)
        return before[np.maximum(i - 1, 0)] * (i > 0) + inside

    return np.asarray(upto(end) - upto(start), np.int64)


def classify(kinds: list[str], names: list[str], depths: npt.NDArray[np.integer]) -> tuple[npt.NDArray[np.str_], bool]:
    """Each interval's class (compute, comm, data or '' for none) and whether the rank has GPU work."""
    on_gpu = any(kind in GPU_KINDS for kind in kinds)
    classes = np.empty(len(kinds), dtype="<U7")
    for i, (kind, name) in enumerate(zip(kinds, names, strict=True)):
        collective = bool(COLLECTIVE.search(name))
        if kind in GPU_KINDS:
            classes[i] = "comm" if collective else "compute"
        elif kind in HOST_KINDS:
            if DATA.search(name):
                classes[i] = "data"
            elif on_gpu:
                classes[i] = ""
            elif collective:
                classes[i] = "comm"
            else:
                classes[i] = "compute" if depths[i] == 0 else ""
        else:
            classes[i] = ""
    return classes, on_gpu


def step_parts(step_start: I64, step_end: I64, compute: Intervals, comm: Intervals, data: Intervals) -> dict[str, I64]:
    """Each step's parts (compute_ns, comm_ns, data_ns, idle_ns), adding up to its time."""
    dur = step_end - step_start
    c = covered(compute, step_start, step_end)
    cm = covered(compute | comm, step_start, step_end)
    cmd = covered(compute | comm | data, step_start, step_end)
    return {"compute_ns": c, "comm_ns": cm - c, "data_ns": cmd - cm, "idle_ns": dur - cmd}
