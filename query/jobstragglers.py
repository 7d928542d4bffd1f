"""Stragglers of a job, from its ranks' steps: pure functions over (steps x ranks) matrices.

The rule. A rank's own time in a step is its step time less its exposed communication: the time it
spent working (compute, data loading, host) rather than waiting for the others in a collective. In a
synchronous job every rank's step time is about the same, since the others wait for the slowest; its
own time is where a straggler shows. For each step, over the ranks that have it: the median own time m
and the robust spread s = 1.4826 x MAD (the median of |own - m|; 1.4826 makes it the standard deviation
for normal noise). A rank-step is slow when own - m > max(K_MAD x s, MIN_RELATIVE x m, MIN_NS).
A straggler is a rank's run of slow steps, gaps of up to MAX_GAP steps joined, MIN_STEPS steps at least.
On synthetic jobs with no straggler (every rank's own time the same with 3 % independent log-normal
noise), this flags no rank-step of 2,048,000 (tests/test_job.py measures it).

What the job lost (the what-if of ByteDance's OSDI'25 straggler study): had the rank run at the median
rank's pace, a step would have waited for the slowest of the others instead; the loss in a step is
own - max(the largest own time of the other ranks, m) where that is positive, 0 otherwise.

Why: the straggler's parts in its slow steps next to its peers' (their median per step), compute, data
and idle; the part that grew most is the cause.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

K_MAD = 6.0
MIN_RELATIVE = 0.05
MIN_NS = 100_000.0
MAX_GAP = 1
MIN_STEPS = 1
ROBUST_SIGMA = 1.4826
CAUSES = ("compute_ns", "data_ns", "idle_ns")


@dataclass(frozen=True)
class Straggler:
    rank: int
    first_step: int
    last_step: int
    slow_steps: int  # steps of the range flagged slow
    excess_ns: int  # own time over the median, summed over the slow steps
    lost_ns: int  # what the job lost to it (the what-if), summed over the range
    job_ns: int  # the job's time over the range (median rank's step time, summed)
    cause: str  # the part that grew most: compute, data or idle
    growth_ns: dict[str, int]  # per part: its mean per step over the peers' median, in the range


def slow_mask(own: F64) -> F64:
    """Per step and rank: how far over the threshold (> 0: slow); NaN where the rank lacks the step."""
    median = np.nanmedian(own, axis=1, keepdims=True)
    spread = ROBUST_SIGMA * np.nanmedian(np.abs(own - median), axis=1, keepdims=True)
    threshold = np.maximum(np.maximum(K_MAD * spread, MIN_RELATIVE * median), MIN_NS)
    return np.asarray(own - median - threshold, np.float64)


def losses(own: F64) -> F64:
    """Per step and rank: the job's loss to that rank (the what-if), 0 for all but the slowest."""
    filled = np.where(np.isnan(own), -np.inf, own)
    if own.shape[1] < 2:
        return np.zeros_like(own)
    order = np.argsort(filled, axis=1)
    top, second = order[:, -1], order[:, -2]
    rows = np.arange(own.shape[0])
    median = np.nanmedian(own, axis=1)
    lost = filled[rows, top] - np.maximum(filled[rows, second], median)
    out = np.zeros_like(own)
    out[rows, top] = np.where(np.isfinite(lost), np.maximum(lost, 0.0), 0.0)
    return out


def _runs(flags: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """Index ranges [first, last] of True, gaps of up to MAX_GAP joined."""
    at = np.flatnonzero(flags)
    if not at.size:
        return []
    breaks = np.flatnonzero(np.diff(at) > MAX_GAP + 1)
    heads = np.concatenate([[0], breaks + 1])
    tails = np.concatenate([breaks, [at.size - 1]])
    return [(int(at[h]), int(at[t])) for h, t in zip(heads, tails, strict=True) if t - h + 1 >= MIN_STEPS]


def stragglers(
    steps: npt.NDArray[np.int64], ranks: npt.NDArray[np.int64], dur: F64, parts: dict[str, F64]
) -> list[Straggler]:
    """The stragglers of a job whose steps (rows, numbered `steps`) and ranks (columns, numbered `ranks`)
    have these step times and parts (NaN where missing), longest loss first."""
    if dur.shape[1] < 2 or not dur.shape[0]:
        return []
    own = dur - parts["comm_ns"]
    over = slow_mask(own)
    slow = np.nan_to_num(over, nan=-1.0) > 0
    lost = losses(own)
    median = np.nanmedian(own, axis=1)
    job = np.nanmedian(dur, axis=1)
    found = []
    for column in np.flatnonzero(slow.any(axis=0)):
        for first, last in _runs(slow[:, column]):
            span = slice(first, last + 1)
            peers = np.delete(np.arange(dur.shape[1]), column)
            growth = {}
            for part in CAUSES:
                mine = parts[part][span, column]
                theirs = np.nanmedian(parts[part][span][:, peers], axis=1)
                growth[part] = int(np.nanmean(mine - theirs))
            cause = max(growth, key=lambda p: growth[p])
            found.append(Straggler(
                rank=int(ranks[column]), first_step=int(steps[first]), last_step=int(steps[last]),
                slow_steps=int(slow[span, column].sum()),
                excess_ns=int(np.nansum(np.where(slow[span, column], own[span, column] - median[span], 0.0))),
                lost_ns=int(np.nansum(lost[span, column])), job_ns=int(np.nansum(job[span])),
                cause=cause.removesuffix("_ns"), growth_ns=growth,
            ))  # fmt: skip
    return sorted(found, key=lambda s: (-s.lost_ns, s.rank, s.first_step))


def false_positive_rate(ranks: int, steps: int, noise: float, seed: int = 0) -> tuple[float, int]:
    """Share of rank-steps flagged slow on a job with no straggler: every rank's own time 100 ms with
    log-normal noise of `noise` (0.03: 3 %), no communication. (rate, rank-steps flagged)."""
    rng = np.random.default_rng(seed)
    own = 100e6 * rng.lognormal(0.0, noise, size=(steps, ranks))
    flagged = int((np.nan_to_num(slow_mask(own), nan=-1.0) > 0).sum())
    return flagged / own.size, flagged
