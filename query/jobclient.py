"""The job view as the Python client gives it: a DataFrame per table, and the notes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tracehouse.v1 import query_pb2

TABLES = ("ranks", "stragglers", "telemetry", "collectives", "steps")


@dataclass
class JobView:
    """ranks, stragglers, telemetry, collectives (and steps, when asked): exact ns and bytes integers."""

    ranks: pd.DataFrame
    stragglers: pd.DataFrame
    telemetry: pd.DataFrame
    collectives: pd.DataFrame
    steps: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)
    generation: str = ""


def job_view_of(answer: query_pb2.JobResponse) -> JobView:
    from query.client import frame_of

    frames = {name: frame_of(getattr(answer, name)) for name in TABLES[:-1]}
    steps = frame_of(answer.steps) if answer.HasField("steps") else None
    return JobView(**frames, steps=steps, notes=list(answer.notes), generation=answer.generation)
