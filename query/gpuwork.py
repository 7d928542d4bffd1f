"""The building blocks the analyses share: the kinds of GPU work and of marked ranges as SQL,
the scope in which ranges meet GPU work, and the running reach of intervals whose gaps are
idle time. Pure: text only."""

from __future__ import annotations

from tracehouse.model import GPU_WORK

WORK_KINDS = "(" + ", ".join(f"'{kind}'" for kind in GPU_WORK) + ")"  # as SQL
# ranges a person marked: NVTX ranges (nsys), and the phases and steps of agent.training
RANGE_KINDS = "('nvtx', 'phase', 'step')"
NS = "toUnixTimestamp64Nano"

Query = tuple[str, dict[str, object]]

# Ranges meet GPU work on their host, process and thread, within a scope. A trace's ranges meet its own
# work only (scope: its run id), so that a run's answers depend on that run alone: the same profile
# imported twice, or another profile of the same process, changes nothing, as Nsight Systems sees one
# report. Ranges of runs without a trace (phases of agent.training; scope '') meet the work of any trace
# of their process, which the work lends to scope '': the PyTorch profiler's kernels under the training
# API's phases are two runs. Runs whose times count from an unknown origin (nsys before 2021.3) lend
# their work to no other run.
RELATIVE_RUNS = "(SELECT run_id FROM {db}.runs FINAL WHERE relative_time)"
TRACED_RUNS = "(SELECT run_id FROM {db}.runs FINAL WHERE source IN ('nsys', 'kineto'))"
OWN_RUNS = "(SELECT run_id FROM {db}.runs FINAL WHERE relative_time OR source IN ('nsys', 'kineto'))"
SCOPE = f"if(run_id IN {OWN_RUNS}, run_id, '')"


def own(ranges: str) -> str:
    """Whether a row is of a run that has ranges in `ranges`."""
    return f"(run_id IN (SELECT DISTINCT run_id FROM {ranges}))"


def lent(ranges: str) -> str:
    """Whether a row of GPU work is seen in scope '' too: it may be lent, and `ranges` holds ranges of a
    run without a trace."""
    return f"run_id NOT IN {RELATIVE_RUNS} AND (SELECT countIf(scope = '') > 0 FROM {ranges})"


def reach(work: str, keys: str = "host, gpu") -> str:
    """CTE `reach(<keys>, s, e, reach)`: each interval with the latest end of those sorted
    before it on its GPU (`keys`). Where it starts after that reach, the GPU was idle in
    [reach, s): a gap (the first interval's empty frame gives reach 0, and no interval ends at 0)."""
    return f"""
reach AS (
    SELECT {keys}, s, e,
           max(e) OVER (PARTITION BY {keys} ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM ({work}) WHERE e > s
)"""


GAP = "reach > 0 AND s > reach"
