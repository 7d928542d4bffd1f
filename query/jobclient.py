"""The job view as the Python client gives it: a DataFrame per table, and the notes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tracehouse.v1 import query_pb2

TABLES = ("ranks", "stragglers", "telemetry", "collectives", "steps")
STRAGGLERS_TOLD = 20


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


def headline(view: JobView) -> list[str]:
    """A line for the job, and one per straggler: its loss, cause and telemetry, in human units."""
    from tracehouse.units import duration, metric_value

    ranks = view.ranks
    hosts = ranks["host"].nunique() if not ranks.empty else 0
    lines = [f"job: {len(ranks)} ranks on {hosts} host(s); {len(view.stragglers)} straggler(s)"]
    for row in view.stragglers.to_dict(orient="records")[:STRAGGLERS_TOLD]:
        share = row["lost_ns"] / row["job_ns"] if row["job_ns"] else 0.0
        growth = row[f"{row['cause']}_growth_ns"]
        lines.append(
            f"rank {row['rank']}, steps {row['first_step']}-{row['last_step']} ({row['slow_steps']} slow): "
            f"the job lost {duration(row['lost_ns'])} of {duration(row['job_ns'])} ({share:.1%}); "
            f"cause: {row['cause']} (+{duration(growth)} a step over its peers)"
        )
        said = view.telemetry[
            (view.telemetry["rank"] == row["rank"]) & (view.telemetry["first_step"] == row["first_step"])
        ]
        for t in said.to_dict(orient="records"):
            if t["metric"] == "gpu.throttle_reasons":
                lines.append(f"  throttle reasons: {t['detail']}")
            elif pd.notna(t["rank_mean"]) and pd.notna(t["peers_mean"]):
                lines.append(
                    f"  {t['metric']}: {metric_value(t['metric'], t['rank_mean'])} beside its peers' "
                    f"{metric_value(t['metric'], t['peers_mean'])}"
                )
    return lines
