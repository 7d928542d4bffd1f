"""Stragglers of a job, from its ranks' steps: pure functions over (steps x ranks) matrices.

The rule. A rank's own time in a step is its step time less its exposed communication: the time it
spent working (compute, data loading, host) rather than waiting for the others in a collective. In a
synchronous job every rank's step time is about the same, since the others wait for the slowest; its
own time is where a straggler shows. For each step, over the ranks that have it: the median own time m
and the robust spread s = 1.4826 x MAD (the median of |own - m|; 1.4826 makes it the standard deviation
for normal noise). A rank-step is slow when own - m > max(K_MAD x s, MIN_RELATIVE x m, MIN_NS).
A straggler is a rank's run of slow steps, gaps of up to MAX_GAP steps joined, MIN_SLOW slow steps at least:
one slow step alone is noise, or a hiccup too short to matter. On synthetic jobs with no straggler (every
rank's own time the same with 3 % independent log-normal noise), 1,024 ranks x 2,000 steps, the rule flags
about 1 rank-step in 10,000 as slow (193 of 2,048,000, seed 1) and reports no straggler
(tests/test_job.py measures both).

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

K_MAD = 4.0
MIN_RELATIVE = 0.05
MIN_NS = 100_000.0
MAX_GAP = 2
MIN_SLOW = 2
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


def nan_median(values: F64, axis: int) -> F64:
    """np.nanmedian along `axis` of a 2-D array, by one sort (NaN sorts last): numpy's own takes a Python
    loop over the other axis once any value is NaN. Without NaN, numpy's median (a partition) is quicker."""
    if axis == 0:  # along rows of the transpose: a partition of contiguous memory is several times quicker
        return nan_median(np.ascontiguousarray(values.T), 1)
    if not np.isnan(values).any():
        return np.asarray(np.median(values, axis=axis), np.float64)
    ordered = np.sort(values, axis=axis)
    n = (~np.isnan(values)).sum(axis=axis, keepdims=True)
    low = np.take_along_axis(ordered, np.maximum((n - 1) // 2, 0), axis=axis)
    high = np.take_along_axis(ordered, n // 2 - (n == 0), axis=axis)
    return np.asarray(np.where(n > 0, (low + high) / 2, np.nan).squeeze(axis), np.float64)


def slow_mask(own: F64, median_own: F64 | None = None) -> F64:
    """Per step and rank: how far over the threshold (> 0: slow); NaN where the rank lacks the step.
    `median_own`: nan_median(own, 1), where the caller has it."""
    median = (nan_median(own, 1) if median_own is None else median_own)[:, None]
    spread = ROBUST_SIGMA * nan_median(np.abs(own - median), 1)[:, None]
    threshold = np.maximum(np.maximum(K_MAD * spread, MIN_RELATIVE * median), MIN_NS)
    return np.asarray(own - median - threshold, np.float64)


def losses(own: F64, median_own: F64 | None = None) -> F64:
    """Per step and rank: the job's loss to that rank (the what-if), 0 for all but the slowest."""
    filled = np.where(np.isnan(own), -np.inf, own)
    if own.shape[1] < 2:
        return np.zeros_like(own)
    rows = np.arange(own.shape[0])
    top = np.argmax(filled, axis=1)
    first = filled[rows, top]
    filled[rows, top] = -np.inf
    second = filled.max(axis=1)
    median = nan_median(own, 1) if median_own is None else median_own
    lost = first - np.maximum(second, median)
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
    return [(int(at[h]), int(at[t])) for h, t in zip(heads, tails, strict=True) if t - h + 1 >= MIN_SLOW]


def stragglers(
    steps: npt.NDArray[np.int64],
    ranks: npt.NDArray[np.int64],
    dur: F64,
    parts: dict[str, F64],
    over: F64 | None = None,
) -> list[Straggler]:
    """The stragglers of a job whose steps (rows, numbered `steps`) and ranks (columns, numbered `ranks`)
    have these step times and parts (NaN where missing), longest loss first; `over`: slow_mask of the
    own times, where the caller has it."""
    if dur.shape[1] < 2 or not dur.shape[0]:
        return []
    own = dur - parts["comm_ns"]
    median = nan_median(own, 1)
    over = slow_mask(own, median) if over is None else over
    slow = np.nan_to_num(over, nan=-1.0) > 0
    lost = losses(own, median)
    job = nan_median(dur, 1)
    found = []
    for column in np.flatnonzero(slow.any(axis=0)):
        for first, last in _runs(slow[:, column]):
            span = slice(first, last + 1)
            peers = np.delete(np.arange(dur.shape[1]), column)
            growth = {}
            for part in CAUSES:
                mine = parts[part][span, column]
                theirs = nan_median(parts[part][span][:, peers], 1)
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
    """On a job with no straggler (every rank's own time 100 ms with log-normal noise of `noise`, 0.03: 3 %,
    no communication): the share of rank-steps flagged slow, and the stragglers reported."""
    rng = np.random.default_rng(seed)
    own = 100e6 * rng.lognormal(0.0, noise, size=(steps, ranks))
    flagged = int((np.nan_to_num(slow_mask(own), nan=-1.0) > 0).sum())
    zero = np.zeros_like(own)
    found = stragglers(np.arange(steps), np.arange(ranks), own, {"comm_ns": zero, **dict.fromkeys(CAUSES, zero)})
    return flagged / own.size, len(found)
