"""Which window a GPU busy % is over, and the profiler-step window a trace may offer instead of its run's.

A run's window (query/window.run_window) is the whole run: what `gpu-time --run`, compare and every page
measure busy % over. Tools like AMD TraceLens measure it over the profiler steps instead: the span, on
the GPU, of the `ProfilerStep#N` annotations the PyTorch profiler writes (`gpu_user_annotation` events,
stored as kind gpu_annotation). A trace without them has its CPU-side steps (kind step): their GPU side
is the GPU work launched from inside them (the NVTX→GPU projection, query/projection.py), as Kineto
projects an annotation onto the GPU. The window runs from the first step's GPU start to the last one's
GPU end, on every GPU of the run.

`step_window` is pure; `profiler_step_window` asks a Query client for what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import pandas as pd

from query.client import QueryFailed
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.wallclock import ns_of

STEP_PREFIX = "ProfilerStep#"
OVER_RUN = "run"  # `gpu-time --over`: the run's window (the default)
OVER_STEPS = "profiler-steps"  # the GPU side of its ProfilerStep#N annotations
OVER_CHOICES = (OVER_RUN, OVER_STEPS)
FROM_ANNOTATIONS = "GPU annotations"  # GPU-side ProfilerStep#N annotations
FROM_STEPS = "projected"  # the GPU work launched inside the CPU-side steps


@dataclass(frozen=True)
class StepWindow:
    start_ns: int
    end_ns: int
    steps: int  # how many steps it spans
    found_from: str  # FROM_ANNOTATIONS or FROM_STEPS

    def label(self) -> str:
        """What a busy % over it is over, in the `window` column gpu-time answers."""
        return f"{OVER_STEPS} ({self.steps} step{'s' if self.steps != 1 else ''}, {self.found_from})"


class StepClient(Protocol):
    def events(
        self, kinds: Any = (), names: Any = (), limit: int | None = None, page_size: int = 0, **window: Any
    ) -> pd.DataFrame: ...

    def nvtx_gpu(self, limit: int = 0, **window: Any) -> dict[str, pd.DataFrame]: ...

    def gpu_time(self, min_gap_ns: int = 0, max_gaps: int = 0, **window: Any) -> dict[str, pd.DataFrame]: ...


def step_window(annotations: pd.DataFrame, ranges: pd.DataFrame) -> StepWindow | None:
    """The profiler-step window of a run from its gpu_annotation events (`annotations`: name, start, end)
    and its marked ranges with their projection (`ranges`: kind, gpu_start_ns, gpu_end_ns, as the Query
    client's nvtx_gpu answers them); None when it has neither GPU-side ProfilerStep annotations nor
    steps that launched GPU work."""
    return _annotated(annotations) or _projected(ranges)


def _annotated(annotations: pd.DataFrame) -> StepWindow | None:
    if len(annotations) and "name" in annotations:
        marked = annotations[annotations["name"].astype(str).str.startswith(STEP_PREFIX)]
        starts = [ns for ns in map(ns_of, marked["start"]) if ns is not None]
        ends = [ns for ns in map(ns_of, marked["end"]) if ns is not None]
        if starts and ends and max(ends) > min(starts):
            return StepWindow(min(starts), max(ends), int(marked["name"].nunique()), FROM_ANNOTATIONS)
    return None


def _projected(ranges: pd.DataFrame) -> StepWindow | None:
    if len(ranges) and "kind" in ranges:
        steps = ranges[(ranges["kind"] == "step") & ranges["gpu_start_ns"].notna() & ranges["gpu_end_ns"].notna()]
        if len(steps):
            start, end = int(steps["gpu_start_ns"].min()), int(steps["gpu_end_ns"].max())
            if end > start:
                return StepWindow(start, end, len(steps), FROM_STEPS)
    return None


def profiler_step_window(client: StepClient, run: str) -> StepWindow | None:
    """The profiler-step window of run `run` (id or name), asked of `client` (query.client.Client): the
    projection of its ranges (nvtx_gpu) only where it has no GPU-side ProfilerStep annotations."""
    found = _annotated(client.events(["gpu_annotation"], limit=DEFAULT_LIMITS.max_page_size, run=run))
    return found or _projected(client.nvtx_gpu(DEFAULT_LIMITS.max_list_rows, run=run)["ranges"])


def no_steps(run: str) -> str:
    """The refusal when a run has no profiler-step window."""
    return (
        f"--over {OVER_STEPS}: run {run!r} has no profiler steps on the GPU (no GPU-side {STEP_PREFIX}N "
        f"annotations, and no {STEP_PREFIX}N step that launched GPU work); its busy % is over the run: "
        f"leave out --over"
    )


def window_label(run: str, from_ns: object, to_ns: object, range_name: str | None) -> str:
    """What a gpu-time answer's busy % is over, given what the question named (the `window` column):
    a range's instance, the times given, the run's window, or (none of them) the span of the GPU work."""
    if range_name:
        return f"range {range_name}"
    if from_ns is not None or to_ns is not None:
        return "from-to" + (" (within the run)" if run else "")
    return OVER_RUN if run else "GPU work (first start to last end)"


def gpu_time_over(
    client: StepClient, over: str, min_gap_ns: int, max_gaps: int, **window: Any
) -> dict[str, pd.DataFrame]:
    """The Query client's gpu_time over the window asked (`window`: its keyword arguments), or, `over`
    OVER_STEPS, over the run's profiler-step window; each GPU's row says in `window` what its busy % is
    over. Raises QueryFailed (INVALID_ARGUMENT) for profiler steps with no run or with times of their own,
    (FAILED_PRECONDITION) for a run without profiler steps on the GPU."""
    run = str(window.get("run") or "")
    label = window_label(run, window.get("start"), window.get("end"), window.get("range"))
    if over not in OVER_CHOICES:
        raise QueryFailed(grpc.StatusCode.INVALID_ARGUMENT, f"--over {over!r}: use one of {', '.join(OVER_CHOICES)}")
    if over == OVER_STEPS:
        if not run:
            raise QueryFailed(grpc.StatusCode.INVALID_ARGUMENT, f"--over {OVER_STEPS}: name the run (--run RUN)")
        if any(window.get(key) is not None for key in ("start", "end", "range")):
            raise QueryFailed(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"--over {OVER_STEPS} is the steps' window: leave out --from, --to and --range",
            )
        steps = profiler_step_window(client, run)
        if steps is None:
            raise QueryFailed(grpc.StatusCode.FAILED_PRECONDITION, no_steps(run))
        window = {**window, "start": steps.start_ns, "end": steps.end_ns}
        label = steps.label()
    answer = client.gpu_time(min_gap_ns, max_gaps, **window)
    answer["gpus"]["window"] = [label] * len(answer["gpus"])
    return answer
